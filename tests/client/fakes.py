"""A scripted OpenAI-compatible HTTP server for SDK tests: real sockets, real aiohttp.

It runs on its own event loop in a background thread so that the blocking SDK (which waits
on the caller's thread) and the async SDK (on the test's loop) can both talk to it.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from multidict import CIMultiDict

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Seen:
    """One request as the server received it."""

    method: str
    path: str
    headers: CIMultiDict[str]  # case-insensitive, as HTTP header names are
    body: Any
    raw: bytes = b""


@dataclass
class ScriptedServer:
    """Answers the n-th request with `script[n]` (the last entry repeats), recording each."""

    script: list[Handler]
    seen: list[Seen] = field(default_factory=list)
    url: str = ""

    def __post_init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw
        self.seen.append(Seen(request.method, request.path, CIMultiDict(request.headers), body,
                              raw))
        handler = self.script[min(len(self.seen), len(self.script)) - 1]
        return await handler(request)

    async def _start(self) -> str:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    @property
    def attempts(self) -> int:
        return len(self.seen)


# -- canned responses ------------------------------------------------------------------

ROUTING = {"X-Prefix-Router-Worker": "w1", "X-Prefix-Router-Reason": "warm"}


def error(status: int, message: str = "nope", *, retry_after: str | None = None,
          err_type: str = "error") -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        headers = {"Retry-After": retry_after} if retry_after is not None else {}
        body = {"error": {"message": message, "type": err_type, "code": status}}
        return web.json_response(body, status=status, headers=headers)
    return handler


def chat_ok(text: str = "hello") -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response({
            "id": "chatcmpl-1", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": "stop"}],
        }, headers=ROUTING)
    return handler


def completion_ok(text: str = "hello") -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response({
            "id": "cmpl-1", "object": "text_completion", "model": "m",
            "choices": [{"index": 0, "text": text, "finish_reason": "stop"}],
        }, headers=ROUTING)
    return handler


def chat_chunk(content: str | None, *, role: str | None = None) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    if role:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    return {"id": "c", "object": "chat.completion.chunk", "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}


def completion_chunk(text: str) -> dict[str, Any]:
    return {"id": "c", "object": "text_completion", "model": "m",
            "choices": [{"index": 0, "text": text, "finish_reason": None}]}


def sse(events: list[Any], *, done: bool = True, split: int = 0,
        delay: float = 0.0) -> Handler:
    """A streamed response: each event as `data: <json>\\n\\n` (strings sent verbatim), then
    `data: [DONE]`; `split` > 0 writes the bytes in pieces of that size to exercise
    reassembly of events cut across TCP reads."""

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", **ROUTING})
        await response.prepare(request)
        payload = b""
        for event in events:
            data = event if isinstance(event, str) else json.dumps(event)
            payload += f"data: {data}\n\n".encode()
        if done:
            payload += b"data: [DONE]\n\n"
        step = split or len(payload)
        for i in range(0, len(payload), step):
            await response.write(payload[i:i + step])
            if delay:
                await asyncio.sleep(delay)
        await response.write_eof()
        return response
    return handler


def slow(seconds: float) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(seconds)
        return web.json_response({"choices": []})
    return handler
