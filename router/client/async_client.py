"""`AsyncContextClient`: the SDK on aiohttp.

One `aiohttp.ClientSession` per client, created lazily inside the running loop (a session is
bound to the loop it was created on), so keep one client per event loop and reuse it: the
connection pool is what makes many small requests cheap.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Mapping, Sequence
from typing import Any, Literal, overload

import aiohttp

from router.client.bodies import chat_body, completion_body
from router.client.contract import CONTEXT_HASH_HEADER, REASON_HEADER, WORKER_HEADER
from router.client.errors import (
    APIConnectionError,
    APITimeoutError,
    PrefixRouterError,
    error_body,
    status_error,
)
from router.client.hashing import (
    DOCUMENT_SEPARATOR,
    context_hash,
    is_valid_key,
    join_documents,
)
from router.client.results import AsyncStream, Completion
from router.client.retry import RETRY_STATUSES, Backoff, parse_retry_after
from router.client.sse import response_text

Context = str | Sequence[str]

# Errors that mean "no response was received": safe to retry, since no byte of a response
# body was consumed. A ConnectionTimeoutError is a connect timeout, not a read timeout.
_CONNECT_ERRORS: tuple[type[BaseException], ...] = (
    aiohttp.ClientConnectorError,
    aiohttp.ConnectionTimeoutError,
    aiohttp.ServerDisconnectedError,
    aiohttp.ClientOSError,
)


def normalize_base_url(base_url: str) -> str:
    """`http://host:8000`, `http://host:8000/` and `http://host:8000/v1` all mean the same
    OpenAI API root; the SDK appends paths such as `/chat/completions` to `.../v1`."""
    url = base_url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


class AsyncContextClient:
    """Async client for prefix-router (or any OpenAI-compatible server) that names the
    retrieved context in the `X-Context-Hash` header.

    Args:
        base_url: the router, e.g. `http://127.0.0.1:8000` (a trailing `/v1` is optional).
        api_key: sent as `Authorization: Bearer ...` when given.
        timeout: seconds a whole non-streamed request may take; for a stream, the longest
            silence allowed between two chunks (a stream may run for as long as it sends).
        connect_timeout: seconds to establish a connection.
        max_retries: retries after the first attempt on connect errors, 429 and 503.
        backoff: retry timing (see `Backoff`).
        headers: extra headers sent with every request.
        separator: joins documents into the context and the context to the question.
        session: an existing aiohttp session to use (not closed by `aclose`).
        rng: random source for backoff jitter (tests pass a seeded one).
    """

    def __init__(self, base_url: str, *, api_key: str | None = None, timeout: float = 600.0,
                 connect_timeout: float = 10.0, max_retries: int = 2,
                 backoff: Backoff | None = None, headers: Mapping[str, str] | None = None,
                 separator: str = DOCUMENT_SEPARATOR,
                 session: aiohttp.ClientSession | None = None,
                 rng: random.Random | None = None) -> None:
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        self.base_url = normalize_base_url(base_url)
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.max_retries = max_retries
        self.backoff = backoff or Backoff()
        self.separator = separator
        self._headers = dict(headers or {})
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._session = session
        self._session_loop: asyncio.AbstractEventLoop | None = None
        self._owns_session = session is None
        self._rng = rng or random.Random()

    # -- public API -------------------------------------------------------------------

    @overload
    async def chat(self, context: Context, question: str, *, model: str,
                   stream: Literal[False] = ..., system: str | None = ..., key: str | None = ...,
                   raw: bool = ..., extra_headers: Mapping[str, str] | None = ...,
                   timeout: float | None = ...,  # noqa: ASYNC109 - as openai's
                   **openai_params: Any) -> Completion: ...

    @overload
    async def chat(self, context: Context, question: str, *, model: str,
                   stream: Literal[True], system: str | None = ..., key: str | None = ...,
                   raw: bool = ..., extra_headers: Mapping[str, str] | None = ...,
                   timeout: float | None = ...,  # noqa: ASYNC109 - as openai's
                   **openai_params: Any) -> AsyncStream: ...

    async def chat(self, context: Context, question: str, *, model: str, stream: bool = False,
                   system: str | None = None, key: str | None = None, raw: bool = False,
                   extra_headers: Mapping[str, str] | None = None,
                   timeout: float | None = None,  # noqa: ASYNC109 - as openai's
                   **openai_params: Any) -> Completion | AsyncStream:
        """Ask `question` about `context` (a string, or documents in retrieved order).

        Returns a `Completion`, or with `stream=True` an `AsyncStream` of text deltas (raw
        event dicts with `raw=True`). `key` overrides the context hash (8-64 hex chars).
        Other keyword arguments (`max_tokens`, `temperature`, ...) go into the body as is."""
        text = join_documents(context, self.separator)
        body = chat_body(text, question, model=model, stream=stream, system=system,
                         separator=self.separator, params=openai_params)
        return await self._call("/chat/completions", body, text, key=key, stream=stream,
                                raw=raw, extra_headers=extra_headers, limit=timeout)

    @overload
    async def complete(self, context: Context, prompt: str, *, model: str,
                       stream: Literal[False] = ..., key: str | None = ..., raw: bool = ...,
                       extra_headers: Mapping[str, str] | None = ...,
                       timeout: float | None = ...,  # noqa: ASYNC109 - as openai's
                   **openai_params: Any) -> Completion: ...

    @overload
    async def complete(self, context: Context, prompt: str, *, model: str,
                       stream: Literal[True], key: str | None = ..., raw: bool = ...,
                       extra_headers: Mapping[str, str] | None = ...,
                       timeout: float | None = ...,  # noqa: ASYNC109 - as openai's
                   **openai_params: Any) -> AsyncStream: ...

    async def complete(self, context: Context, prompt: str, *, model: str, stream: bool = False,
                       key: str | None = None, raw: bool = False,
                       extra_headers: Mapping[str, str] | None = None,
                       timeout: float | None = None,  # noqa: ASYNC109 - as openai's
                       **openai_params: Any) -> Completion | AsyncStream:
        """Legacy completions: the prompt sent is `context + separator + prompt`."""
        text = join_documents(context, self.separator)
        body = completion_body(text, prompt, model=model, stream=stream,
                               separator=self.separator, params=openai_params)
        return await self._call("/completions", body, text, key=key, stream=stream, raw=raw,
                                extra_headers=extra_headers, limit=timeout)

    async def models(self) -> list[str]:
        """Ids of the models the router serves (`GET /v1/models`)."""
        response = await self._send("GET", "/models", None, headers={}, stream=False,
                                    limit=None)
        body = await self._read_json(response)
        return [m["id"] for m in body.get("data", []) if isinstance(m, dict) and "id" in m]

    async def aclose(self) -> None:
        """Close the connection pool (only if this client created it)."""
        if self._session is not None and self._owns_session:
            await self._session.close()
        self._session = None

    async def __aenter__(self) -> AsyncContextClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- internals --------------------------------------------------------------------

    async def _call(self, path: str, body: dict[str, Any], context: str, *, key: str | None,
                    stream: bool, raw: bool, extra_headers: Mapping[str, str] | None,
                    limit: float | None) -> Completion | AsyncStream:
        headers = self._context_headers(context, key)
        headers.update(extra_headers or {})
        response = await self._send("POST", path, body, headers=headers, stream=stream,
                                    limit=limit)
        if stream:
            return AsyncStream(response, raw=raw)
        parsed = await self._read_json(response)
        return Completion(text=response_text(parsed), raw=parsed,
                          worker=response.headers.get(WORKER_HEADER),
                          reason=response.headers.get(REASON_HEADER),
                          status=response.status, headers=dict(response.headers))

    @staticmethod
    def _context_headers(context: str, key: str | None) -> dict[str, str]:
        """The routing header. No context and no key means no header: one shared key for
        every context-less request would pin them all to one worker, while the router's
        own prompt hashing spreads them."""
        if key is not None:
            if not is_valid_key(key):
                raise ValueError("key must be 8 to 64 hex characters")
            return {CONTEXT_HASH_HEADER: key}
        return {CONTEXT_HASH_HEADER: context_hash(context)} if context else {}

    def _client_timeout(self, stream: bool, limit: float | None) -> aiohttp.ClientTimeout:
        limit = self.timeout if limit is None else limit
        if stream:
            return aiohttp.ClientTimeout(total=None, connect=self.connect_timeout,
                                         sock_read=limit)
        return aiohttp.ClientTimeout(total=limit, connect=self.connect_timeout)

    def _get_session(self) -> aiohttp.ClientSession:
        """The pool, created on first use in the running loop.

        A session cannot move between loops, and one whose loop has closed cannot even be
        closed cleanly any more (its sockets would leak until garbage collection), so a
        client used from a second loop raises instead of silently opening a new pool.
        After `aclose()` the client may be used from a new loop."""
        loop = asyncio.get_running_loop()
        session = self._session
        if session is not None and not self._owns_session:
            if session.closed:
                raise PrefixRouterError("the session passed to the client is closed")
            return session  # the caller manages its session and its loop
        if session is None or session.closed:
            self._session = session = aiohttp.ClientSession()
            self._session_loop = loop
        elif self._session_loop is not loop:
            raise PrefixRouterError(
                "this AsyncContextClient's connection pool belongs to another event loop "
                "(e.g. an earlier asyncio.run): create the client inside the loop that uses "
                "it, `await client.aclose()` before leaving a loop, or use ContextClient "
                "from synchronous code")
        return session

    async def _send(self, method: str, path: str, body: dict[str, Any] | None, *,
                    headers: Mapping[str, str], stream: bool,
                    limit: float | None) -> aiohttp.ClientResponse:
        """Send with retries; return a 2xx response whose body has not been read.

        Retries happen only here, i.e. before the caller consumed any byte of a body."""
        session = self._get_session()
        all_headers = {**self._headers, **headers}
        # Raw UTF-8, not \u escapes: a non-Latin context would otherwise grow up to 6x.
        data = json.dumps(body, ensure_ascii=False).encode() if body is not None else None
        if data is not None:
            all_headers.setdefault("Content-Type", "application/json")
        client_timeout = self._client_timeout(stream, limit)
        url = self.base_url + path
        attempt = 0
        while True:
            attempt += 1
            retry_after: float | None = None
            try:
                response = await session.request(method, url, data=data, headers=all_headers,
                                                 timeout=client_timeout)
            except _CONNECT_ERRORS as exc:
                error: PrefixRouterError = APIConnectionError(
                    f"cannot reach {url}: {exc!r}", attempts=attempt)
                error.__cause__ = exc
            except (aiohttp.ServerTimeoutError, TimeoutError) as exc:
                raise APITimeoutError(f"{method} {url} timed out", attempts=attempt) from exc
            except aiohttp.ClientError as exc:
                raise APIConnectionError(f"{method} {url} failed: {exc!r}",
                                         attempts=attempt) from exc
            else:
                if response.status < 400:
                    return response
                error = await self._status_error(response, attempt)
                if response.status not in RETRY_STATUSES:
                    raise error
                retry_after = parse_retry_after(response.headers.get("Retry-After"))
                if retry_after is not None and retry_after > self.backoff.max_retry_after:
                    raise error
            if attempt > self.max_retries:
                raise error
            await asyncio.sleep(self.backoff.delay(attempt - 1, retry_after, self._rng))

    @staticmethod
    async def _status_error(response: aiohttp.ClientResponse,
                            attempt: int) -> PrefixRouterError:
        try:
            text = await response.text(errors="replace")
        except (aiohttp.ClientError, TimeoutError):
            text = ""
        finally:
            response.release()
        try:
            body = json.loads(text)
        except ValueError:
            body = None
        if not (isinstance(body, dict) and isinstance(body.get("error"), dict)):
            body = error_body(response.status, text)
        return status_error(response.status, body, headers=dict(response.headers),
                            attempts=attempt)

    @staticmethod
    async def _read_json(response: aiohttp.ClientResponse) -> dict[str, Any]:
        """Read a whole 2xx body. A failure here is not retried: the response had started."""
        try:
            raw = await response.read()
        except TimeoutError as exc:
            raise APITimeoutError("timed out reading the response body") from exc
        except aiohttp.ClientError as exc:
            raise APIConnectionError(f"response body broke: {exc!r}") from exc
        finally:
            response.release()
        try:
            parsed = json.loads(raw)
        except ValueError as exc:
            raise PrefixRouterError(f"response is not JSON: {raw[:200]!r}") from exc
        if not isinstance(parsed, dict):
            raise PrefixRouterError("response JSON is not an object")
        return parsed
