"""The aiohttp app serving vLLM's OpenAI-compatible API on top of one simulated Engine."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import time
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from engine_worker.sim import openai_api as api
from engine_worker.sim.engine import Engine
from engine_worker.sim.tokenizer import HFTokenizer, SimTokenizer

log = logging.getLogger("prefix_sim")


@dataclass
class Faults:
    """Failure injection, for testing the router's failover."""

    fail_rate: float = 0.0     # fraction of requests answered 500 before any byte
    fail_after: int = 0        # 0: never; else request N+1 kills the process mid-stream
    stall_ms: float = 0.0      # real milliseconds slept before the first byte


class SimServer:
    """Owns the request path: parse, fault injection, submit to the engine, stream back."""

    def __init__(self, engine: Engine, tokenizer: SimTokenizer | HFTokenizer,
                 faults: Faults | None = None, seed: int = 0) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.faults = faults or Faults()
        self.model = engine.config.model_name
        self._rng = random.Random(seed)
        self._requests = 0
        self.in_flight = 0
        self.draining = False
        self._idle = asyncio.Event()
        self._idle.set()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_get("/version", self.version)
        app.router.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        return app

    # -- simple endpoints ----------------------------------------------------------
    async def health(self, _: web.Request) -> web.Response:
        return web.Response(status=503 if self.draining else 200)

    async def version(self, _: web.Request) -> web.Response:
        return _json({"version": "prefix-sim"})

    async def reset_prefix_cache(self, _: web.Request) -> web.Response:
        """vLLM's dev-mode endpoint: drop every cached block (an eviction, on demand)."""
        if not self.engine.kv.reset_prefix_cache():
            return web.Response(status=400, text="requests are running; not reset")
        return web.Response(status=200)

    async def metrics(self, _: web.Request) -> web.Response:
        return web.Response(body=self.engine.metrics.render(),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def models(self, _: web.Request) -> web.Response:
        card = {"id": self.model, "object": "model", "created": int(time.time()),
                "owned_by": "vllm", "root": self.model, "parent": None,
                "max_model_len": self.engine.max_model_len}
        return _json({"object": "list", "data": [card]})

    async def tokenize(self, request: web.Request) -> web.Response:
        try:
            body = orjson.loads(await request.read())
            if not isinstance(body, dict):
                raise api.ApiError(400, "the request body must be a JSON object")
            if "messages" in body:
                text = api.render_chat(body["messages"], *api.chat_template_flags(body))
            elif isinstance(body.get("prompt"), str):
                text = body["prompt"]
            else:
                raise api.ApiError(400, "'prompt' (string) or 'messages' is required")
        except orjson.JSONDecodeError:
            return _error(api.ApiError(400, "invalid JSON body"))
        except api.ApiError as err:
            return _error(err)
        tokens = self.tokenizer.encode(text)
        return _json({"count": len(tokens), "max_model_len": self.engine.max_model_len,
                      "tokens": tokens})

    # -- generation ----------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        if self.draining:
            return _error(api.ApiError(503, "server is draining", "ServiceUnavailableError"))
        try:
            params = api.parse(orjson.loads(await request.read()), chat, self.model)
            ids = params.prompt_ids or self.tokenizer.encode(params.prompt_text or "")
            if not ids:
                raise api.ApiError(400, "the prompt is empty")
        except orjson.JSONDecodeError:
            return _error(api.ApiError(400, "invalid JSON body"))
        except api.ApiError as err:
            return _error(err)
        self._requests += 1
        die = self.faults.fail_after > 0 and self._requests > self.faults.fail_after
        if self.faults.fail_rate and self._rng.random() < self.faults.fail_rate:
            return _error(api.ApiError(500, "injected failure", "InternalServerError"))
        if self.faults.stall_ms:
            await asyncio.sleep(self.faults.stall_ms / 1000)
        if die and not params.stream:
            _die()
        try:
            handle = self.engine.submit(ids, params.max_tokens, params.n)
        except ValueError as exc:
            return _error(api.ApiError(400, str(exc)))
        self._enter()
        try:
            if params.stream:
                return await self._stream(request, params, handle, die)
            texts = ["" for _ in range(params.n)]
            async for ev in handle:
                texts[ev.index] += ev.text
            return _json(api.full_response(params, api.new_id(chat), texts, handle.stats))
        finally:
            handle.abort()  # no-op when finished; frees blocks when the client left
            self._leave()

    async def _stream(self, request: web.Request, params: api.Params, handle: Any,
                      die: bool) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        rid, created = api.new_id(params.chat), int(time.time())
        started: set[int] = set()
        async for ev in handle:
            first = ev.index not in started
            started.add(ev.index)
            if params.chat and first:
                await _send(resp, api.chunk(params, rid, created, ev.index, "", None, True))
            await _send(resp, api.chunk(params, rid, created, ev.index, ev.text, None))
            if die:
                _die()
            if ev.finish_reason is not None:
                await _send(resp, api.chunk(params, rid, created, ev.index,
                                            None if params.chat else "", ev.finish_reason))
        if params.include_usage:
            await _send(resp, api.usage_chunk(params, rid, created, handle.stats))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    def _enter(self) -> None:
        self.in_flight += 1
        self._idle.clear()

    def _leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    async def drain(self, timeout_s: float = 30.0) -> None:
        """Refuse new requests and wait for in-flight ones to finish."""
        self.draining = True
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout_s)


async def _send(resp: web.StreamResponse, obj: dict[str, Any]) -> None:
    await resp.write(b"data: " + orjson.dumps(obj) + b"\n\n")


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(obj), status=status, content_type="application/json")


def _error(err: api.ApiError) -> web.Response:
    return _json(err.body(), status=err.status)


def _die() -> None:
    """--fail-after: vanish like a crashed engine; open connections are cut."""
    log.error("prefix-sim: injected crash (--fail-after)")
    logging.shutdown()
    os._exit(17)
