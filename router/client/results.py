"""What calls return: a small result for whole responses, async streams for SSE."""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from router.client.contract import REASON_HEADER, WORKER_HEADER
from router.client.errors import StreamError
from router.client.sse import DONE, SSEDecoder, delta_text


@dataclass(frozen=True)
class Completion:
    """A whole (non-streamed) response.

    `raw` is the parsed OpenAI JSON, untouched; `text` is choice 0's text; `worker` and
    `reason` are the router's routing decision (None when talking to a plain vLLM)."""

    text: str
    raw: dict[str, Any]
    worker: str | None
    reason: str | None
    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)


class AsyncStream:
    """Async iterator over a streamed response: text deltas of choice 0, or the raw event
    dicts when created with `raw=True`.

    It exists only after the response headers arrived (retries are over), so `.worker` and
    `.reason` are known before the first delta. Leaving it early (`aclose()`, `async with`)
    closes the connection, which makes the router cancel the generation upstream."""

    def __init__(self, response: aiohttp.ClientResponse, *, raw: bool = False) -> None:
        self._response = response
        self._raw = raw
        self._decoder = SSEDecoder()
        self._pending: deque[str] = deque()
        self._done = False
        self._parts: list[str] = []
        self.status = response.status
        self.headers: dict[str, str] = dict(response.headers)
        self.worker: str | None = response.headers.get(WORKER_HEADER)
        self.reason: str | None = response.headers.get(REASON_HEADER)

    @property
    def text(self) -> str:
        """The text of choice 0 received so far."""
        return "".join(self._parts)

    def __aiter__(self) -> AsyncStream:
        return self

    async def __anext__(self) -> Any:
        while True:
            while self._pending:
                item = self._event(self._pending.popleft())
                if item is not None:
                    return item
            if self._done:
                raise StopAsyncIteration
            await self._fill()

    async def _fill(self) -> None:
        try:
            chunk = await self._response.content.readany()
        except (aiohttp.ClientError, TimeoutError) as exc:
            await self.aclose()
            raise StreamError(f"stream broke: {exc!r}", worker=self.worker) from exc
        if chunk:
            self._pending.extend(self._decoder.feed(chunk))
            return
        self._pending.extend(self._decoder.close())
        if DONE not in self._pending:
            await self.aclose()
            raise StreamError("stream ended without [DONE]", worker=self.worker,
                              body={"error": {"message": "stream ended without [DONE]",
                                              "type": "incomplete_stream", "code": None}})
        self._response.release()

    def _event(self, payload: str) -> Any:
        """The item to yield for one event, or None to skip it (e.g. a role-only delta)."""
        if payload == DONE:
            self._pending.clear()
            self._done = True
            self._response.release()
            return None
        try:
            event = json.loads(payload)
        except ValueError as exc:
            self._done = True
            self._response.close()
            raise StreamError(f"malformed event: {payload[:200]!r}", worker=self.worker) from exc
        if isinstance(event, dict) and "error" in event:
            self._done = True
            self._response.close()
            inner = event["error"] if isinstance(event["error"], dict) else {}
            raise StreamError(f"error event: {inner.get('message', event['error'])}",
                              body=event, worker=self.worker)
        text = delta_text(event) if isinstance(event, dict) else ""
        if text:
            self._parts.append(text)
        if self._raw:
            return event
        return text or None

    async def aclose(self) -> None:
        """Stop reading; an unfinished response's connection is closed, not reused."""
        self._done = True
        self._pending.clear()
        self._response.close()

    async def __aenter__(self) -> AsyncStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
