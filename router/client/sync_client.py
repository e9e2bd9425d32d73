"""`ContextClient`: the blocking SDK, a thin wrapper over `AsyncContextClient`.

Why a private event loop in a background thread rather than `asyncio.run` per call: a
streamed response is read chunk by chunk across many `next()` calls, and its aiohttp
connection belongs to the loop that opened it. `asyncio.run` closes its loop when the call
returns, which would kill the stream after the first chunk (and the connection pool with it,
so every call would pay a new TCP handshake). A long-lived loop keeps both alive, works when
the caller is itself inside a running event loop (where `asyncio.run` refuses to start), and
lets many threads share one client: each call is a coroutine scheduled onto that loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections.abc import Coroutine, Iterator, Mapping
from typing import Any, Literal, TypeVar, overload

from router.client.async_client import AsyncContextClient, Context
from router.client.results import AsyncStream, Completion
from router.client.retry import Backoff

T = TypeVar("T")


class _LoopThread:
    """An event loop running forever in a daemon thread, fed coroutines from other threads."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="prefix-router-client",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the loop and wait for it; Ctrl-C in the caller cancels it."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self.loop.close()


def _shutdown(runner: _LoopThread, client: AsyncContextClient) -> None:
    """Close the pool and stop the loop; also run by the finalizer of a forgotten client."""
    if runner.loop.is_closed():
        return
    if runner.loop.is_running():
        # Best effort at shutdown: the loop stops anyway.
        with contextlib.suppress(Exception):
            runner.call(client.aclose())
    runner.stop()


class Stream:
    """Blocking iterator over a streamed response (text deltas, or raw event dicts).

    `.worker`, `.reason` and `.text` as on `AsyncStream`. Use `with` or `close()` to stop
    early: that closes the connection and the router cancels the generation."""

    def __init__(self, inner: AsyncStream, runner: _LoopThread) -> None:
        self._inner = inner
        self._runner = runner
        self.status = inner.status
        self.headers = inner.headers
        self.worker = inner.worker
        self.reason = inner.reason

    @property
    def text(self) -> str:
        return self._inner.text

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        more, item = self._runner.call(self._next())
        if not more:
            raise StopIteration
        return item

    async def _next(self) -> tuple[bool, Any]:
        # StopAsyncIteration is turned into a value: exceptions of the StopIteration family
        # must not cross a Future boundary.
        try:
            return True, await self._inner.__anext__()
        except StopAsyncIteration:
            return False, None

    def close(self) -> None:
        if not self._runner.loop.is_closed():
            self._runner.call(self._inner.aclose())

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class ContextClient:
    """Blocking client; same arguments and behaviour as `AsyncContextClient`.

    Thread-safe: threads may share one client (and its connection pool). Close it with
    `close()` or a `with` block; a forgotten client is closed when garbage-collected."""

    def __init__(self, base_url: str, *, api_key: str | None = None, timeout: float = 600.0,
                 connect_timeout: float = 10.0, max_retries: int = 2,
                 backoff: Backoff | None = None, headers: Mapping[str, str] | None = None,
                 separator: str = "\n\n") -> None:
        self._runner = _LoopThread()
        self._async = AsyncContextClient(
            base_url, api_key=api_key, timeout=timeout, connect_timeout=connect_timeout,
            max_retries=max_retries, backoff=backoff, headers=headers, separator=separator)
        self._finalizer = weakref.finalize(self, _shutdown, self._runner, self._async)

    @property
    def base_url(self) -> str:
        return self._async.base_url

    @overload
    def chat(self, context: Context, question: str, *, model: str,
             stream: Literal[False] = ..., **kwargs: Any) -> Completion: ...

    @overload
    def chat(self, context: Context, question: str, *, model: str,
             stream: Literal[True], **kwargs: Any) -> Stream: ...

    def chat(self, context: Context, question: str, *, model: str, stream: bool = False,
             **kwargs: Any) -> Completion | Stream:
        """See `AsyncContextClient.chat` (`system`, `key`, `raw`, `extra_headers`,
        `timeout`, and OpenAI parameters)."""
        result = self._runner.call(
            self._async.chat(context, question, model=model, stream=stream, **kwargs))
        return Stream(result, self._runner) if isinstance(result, AsyncStream) else result

    @overload
    def complete(self, context: Context, prompt: str, *, model: str,
                 stream: Literal[False] = ..., **kwargs: Any) -> Completion: ...

    @overload
    def complete(self, context: Context, prompt: str, *, model: str,
                 stream: Literal[True], **kwargs: Any) -> Stream: ...

    def complete(self, context: Context, prompt: str, *, model: str, stream: bool = False,
                 **kwargs: Any) -> Completion | Stream:
        """See `AsyncContextClient.complete`."""
        result = self._runner.call(
            self._async.complete(context, prompt, model=model, stream=stream, **kwargs))
        return Stream(result, self._runner) if isinstance(result, AsyncStream) else result

    def models(self) -> list[str]:
        return self._runner.call(self._async.models())

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> ContextClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
