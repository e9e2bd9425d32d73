"""In-process fake OpenAI workers (real aiohttp servers on 127.0.0.1) and the router before them.

A ``FakeWorker`` answers /health, /v1/models, /metrics, /v1/completions and
/v1/chat/completions, whole or as SSE ending in a usage chunk with
``prompt_tokens_details.cached_tokens`` (a crude prefix cache: the longest common prefix
with an earlier prompt). It records what it received and the exact bytes it sent, and can
be told to answer every generation request with an error status, or to hang.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import orjson
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from multidict import CIMultiDict
from prometheus_client.parser import text_string_to_metric_families

from router.config import RouterConfig
from router.server.app import build_app

MODEL = "test-model"
STREAM_TEXT = ("Hel", "lo", " wor", "ld")


class FakeWorker:
    def __init__(self, name: str, model: str = MODEL, log: list[str] | None = None) -> None:
        self.name = name
        self.model = model
        self.status = 200  # generation answers; >= 400 sends an OpenAI error body
        self.hang = False  # generation requests wait (until close) before answering
        self._released = asyncio.Event()
        self.log = log if log is not None else []  # generation requests, by worker name
        self.received: list[tuple[str, bytes, CIMultiDict[str]]] = []
        self.sent: list[bytes] = []  # exact bytes of each generation answer
        self.health_checks = 0
        self._prompts: list[str] = []
        self.server: TestServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None and self.server.port is not None
        return f"http://127.0.0.1:{self.server.port}"

    async def start(self) -> FakeWorker:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/v1/completions", self._generate)
        app.router.add_post("/v1/chat/completions", self._generate)
        self.server = TestServer(app, host="127.0.0.1")
        await self.server.start_server()
        return self

    async def close(self) -> None:
        self._released.set()
        if self.server is not None:
            await self.server.close()

    async def _health(self, request: web.Request) -> web.Response:
        self.health_checks += 1
        return web.json_response({"status": "ok"})

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list",
                                  "data": [{"id": self.model, "object": "model"}]})

    async def _metrics(self, request: web.Request) -> web.Response:
        labels = f'{{model_name="{self.model}"}}'
        return web.Response(text=f"vllm:num_requests_running{labels} 0.0\n"
                                 f"vllm:num_requests_waiting{labels} 0.0\n")

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.received.append((request.path, body, CIMultiDict(request.headers)))
        self.log.append(self.name)
        if self.hang:
            await self._released.wait()
        if self.status != 200:
            error = orjson.dumps({"error": {"message": f"{self.name} says {self.status}",
                                            "type": "test", "code": self.status}})
            self.sent.append(error)
            return web.Response(status=self.status, body=error, content_type="application/json")
        payload = orjson.loads(body)
        usage = self._usage(payload)
        chat = request.path.endswith("/chat/completions")
        if payload.get("stream"):
            return await self._stream(request, chat, usage)
        choice: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
        if chat:
            choice["message"] = {"role": "assistant", "content": "".join(STREAM_TEXT)}
        else:
            choice["text"] = "".join(STREAM_TEXT)
        data = orjson.dumps({"id": f"{self.name}-{len(self.received)}", "served_by": self.name,
                             "object": "chat.completion" if chat else "text_completion",
                             "model": self.model, "choices": [choice], "usage": usage})
        self.sent.append(data)
        return web.Response(body=data, content_type="application/json")

    async def _stream(self, request: web.Request, chat: bool,
                      usage: dict[str, Any]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        events = []
        for text in STREAM_TEXT:
            part = {"delta": {"content": text}} if chat else {"text": text}
            events.append({"id": self.name, "choices": [{"index": 0, **part}]})
        events.append({"id": self.name, "choices": [], "usage": usage})
        sent = [b"data: " + orjson.dumps(e) + b"\n\n" for e in events] + [b"data: [DONE]\n\n"]
        for chunk in sent:
            await response.write(chunk)
            await asyncio.sleep(0.001)  # separate writes, so the router relays several chunks
        self.sent.append(b"".join(sent))
        await response.write_eof()
        return response

    def _usage(self, payload: dict[str, Any]) -> dict[str, Any]:
        if isinstance(payload.get("messages"), list):
            text = "".join(str(m.get("content", "")) for m in payload["messages"])
        else:
            text = str(payload.get("prompt", ""))
        prompt_tokens = max(1, len(text) // 4)
        common = max((_common_prefix(text, p) for p in self._prompts), default=0)
        cached = min(common // 4 // 16 * 16, prompt_tokens - 1)
        self._prompts.append(text)
        return {"prompt_tokens": prompt_tokens, "completion_tokens": len(STREAM_TEXT),
                "total_tokens": prompt_tokens + len(STREAM_TEXT),
                "prompt_tokens_details": {"cached_tokens": cached}}


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@contextlib.asynccontextmanager
async def fake_workers(count: int) -> AsyncIterator[list[FakeWorker]]:
    log: list[str] = []
    fakes = [await FakeWorker(f"w{i}", log=log).start() for i in range(count)]
    try:
        yield fakes
    finally:
        for fake in fakes:
            await fake.close()


@contextlib.asynccontextmanager
async def router_client(workers: Sequence[FakeWorker], **overrides: Any
                        ) -> AsyncIterator[TestClient]:
    """The router app in this loop before ``workers``, ready (a worker is healthy)."""
    settings: dict[str, Any] = {"workers": tuple((w.name, w.url) for w in workers),
                                "health_interval_s": 0.05, "scrape_interval_s": 0.05}
    settings.update(overrides)
    server = TestServer(build_app(RouterConfig(**settings)), host="127.0.0.1",
                        handler_cancellation=True)  # as router/cli.py serves it
    async with TestClient(server) as client:
        await wait_ready(client)
        yield client


async def wait_ready(client: TestClient, timeout_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        async with client.get("/ready") as resp:
            if resp.status == 200:
                return
        if loop.time() > deadline:
            raise AssertionError("the router never became ready")
        await asyncio.sleep(0.02)


async def metric(client: TestClient, sample: str, **labels: str) -> float:
    """One sample's value from the router's /metrics (0 when it was never set)."""
    async with client.get("/metrics") as resp:
        text = await resp.text()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


def chat_body(content: str, *, stream: bool = False, model: str = MODEL) -> dict[str, Any]:
    return {"model": model, "stream": stream, "max_tokens": 4,
            "messages": [{"role": "system", "content": "Answer from the document."},
                         {"role": "user", "content": content}]}
