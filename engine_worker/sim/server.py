"""The aiohttp app serving vLLM's OpenAI-compatible API on top of one simulated Engine."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from engine_worker.sim import openai_api as api
from engine_worker.sim.auth import api_key_middleware
from engine_worker.sim.engine import Engine
from engine_worker.sim.http import error_response, json_response, send_json
from engine_worker.sim.messages_api import MessagesApi
from engine_worker.sim.pooling_api import add_pooling_routes
from engine_worker.sim.request import RequestStats, TokenEvent
from engine_worker.sim.responses_api import ResponsesApi
from engine_worker.sim.tokenizer import HFTokenizer, SimTokenizer

log = logging.getLogger("prefix_sim")

REQUEST_LOG_SIZE = 200_000  # GET /sim/requests: the latest requests, ~40 MB at most


@dataclass
class Faults:
    """Failure injection, for testing the router's failover."""

    fail_rate: float = 0.0     # fraction of requests answered 500 before any byte
    fail_after: int = 0        # 0: never; else request N+1 kills the process mid-stream
    stall_ms: float = 0.0      # real milliseconds slept before the first byte


class SimServer:
    """Owns the request path: parse, fault injection, submit to the engine, stream back."""

    def __init__(self, engine: Engine, tokenizer: SimTokenizer | HFTokenizer,
                 faults: Faults | None = None, seed: int = 0,
                 api_key: str | None = None,
                 kv_event_sources: list[dict[str, Any]] | None = None) -> None:
        self.engine = engine
        self.api_key = api_key  # vLLM's --api-key: guards every route but the public ones
        self.kv_event_sources = kv_event_sources or []  # what GET /kv_event_sources lists
        self.tokenizer = tokenizer
        self.faults = faults or Faults()
        self.model = engine.config.model_name
        self.adapters: dict[str, str] = {}  # LoRA adapters loaded: name -> path
        self._rng = random.Random(seed)
        self._requests = 0
        self.in_flight = 0
        self.draining = False
        self._idle = asyncio.Event()
        self._idle.set()
        # (response id, engine TTFT, server TTFT, prompt tokens, cached tokens) of the latest
        # requests served: a load test joins them to its own records to split a client's
        # TTFT into the engine's, this server's and the hops outside it, per request
        # (vLLM's TTFT histogram has 100-250 ms in one bucket)
        self.served: deque[tuple[str, float, float | None, int, int]] = \
            deque(maxlen=REQUEST_LOG_SIZE)

    def app(self) -> web.Application:
        middlewares = [api_key_middleware(self.api_key)] if self.api_key else []
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=middlewares)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_get("/version", self.version)
        app.router.add_get("/kv_event_sources", self.event_sources)
        app.router.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        app.router.add_post("/v1/load_lora_adapter", self.load_lora_adapter)
        app.router.add_get("/sim/requests", self.requests_served)
        ResponsesApi(self).add_routes(app)
        add_pooling_routes(app, self)
        MessagesApi(self).add_routes(app)
        return app

    # -- simple endpoints ----------------------------------------------------------
    async def health(self, _: web.Request) -> web.Response:
        return web.Response(status=503 if self.draining else 200)

    async def version(self, _: web.Request) -> web.Response:
        return json_response({"version": "prefix-sim"})

    async def event_sources(self, _: web.Request) -> web.Response:
        """vLLM's KV-event discovery: one entry per data-parallel rank (one here), a JSON
        array of {data_parallel_rank, endpoint, replay_endpoint, topic}; [] without events."""
        return json_response(self.kv_event_sources)

    async def reset_prefix_cache(self, _: web.Request) -> web.Response:
        """vLLM's dev-mode endpoint: drop every cached block (an eviction, on demand)."""
        if not self.engine.kv.reset_prefix_cache():
            return web.Response(status=400, text="requests are running; not reset")
        return web.Response(status=200)

    async def metrics(self, _: web.Request) -> web.Response:
        return web.Response(body=self.engine.metrics.render(),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def requests_served(self, _: web.Request) -> web.Response:
        """The simulator's own: each recent request's response id, its engine TTFT (the
        model's: arrival at the engine to its first token) and its server TTFT (this
        process's clock: receipt of the request to its first token leaving the engine,
        so parsing, tokenizing and the event loop's lag behind the model under CPU
        contention too), in simulated seconds, oldest first."""
        return json_response([{"id": rid, "ttft_s": ttft, "server_ttft_s": server,
                               "prompt_tokens": prompt, "cached_tokens": cached}
                              for rid, ttft, server, prompt, cached in self.served])

    async def models(self, _: web.Request) -> web.Response:
        created = int(time.time())
        cards = [{"id": self.model, "object": "model", "created": created,
                  "owned_by": "vllm", "root": self.model, "parent": None,
                  "max_model_len": self.engine.max_model_len}]
        cards += [{"id": name, "object": "model", "created": created, "owned_by": "vllm",
                   "root": path, "parent": self.model} for name, path in self.adapters.items()]
        return json_response({"object": "list", "data": cards})

    async def load_lora_adapter(self, request: web.Request) -> web.Response:
        """vLLM's runtime LoRA loading (VLLM_ALLOW_RUNTIME_LORA_UPDATING), without weights."""
        try:
            body = orjson.loads(await request.read())
            name, path = body["lora_name"], body["lora_path"]
            if not isinstance(name, str) or not isinstance(path, str):
                raise KeyError(name)
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return error_response(api.ApiError(400, "'lora_name' and 'lora_path' are required"))
        self.adapters[name] = path
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    def lora(self, model: str) -> tuple[str, str] | None:
        """(name, path) when ``model`` names a loaded adapter: its blocks are keyed apart."""
        path = self.adapters.get(model)
        return None if path is None else (model, path)

    def submit(self, ids: list[int], max_tokens: int, model: str,
               cache_salt: str | None = None) -> Any:
        return self.engine.submit(ids, max_tokens, 1, cache_salt=cache_salt,
                                  lora=self.lora(model))

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
            return error_response(api.ApiError(400, "invalid JSON body"))
        except api.ApiError as err:
            return error_response(err)
        tokens = self.tokenizer.encode(text)
        return json_response({"count": len(tokens), "max_model_len": self.engine.max_model_len,
                      "tokens": tokens})

    # -- generation ----------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        received = self.engine.clock.now()
        if self.draining:
            return error_response(api.ApiError(503, "server is draining",
                                               "ServiceUnavailableError"))
        try:
            params = api.parse(orjson.loads(await request.read()), chat, self.model,
                               self.adapters)
            ids = params.prompt_ids or self.tokenizer.encode(params.prompt_text or "")
            if not ids:
                raise api.ApiError(400, "the prompt is empty")
        except orjson.JSONDecodeError:
            return error_response(api.ApiError(400, "invalid JSON body"))
        except api.ApiError as err:
            return error_response(err)
        self._requests += 1
        die = self.faults.fail_after > 0 and self._requests > self.faults.fail_after
        if self.faults.fail_rate and self._rng.random() < self.faults.fail_rate:
            return error_response(api.ApiError(500, "injected failure", "InternalServerError"))
        if self.faults.stall_ms:
            await asyncio.sleep(self.faults.stall_ms / 1000)
        if die and not params.stream:
            _die()
        try:
            handle = self.engine.submit(ids, params.max_tokens, params.n,
                                        cache_salt=params.cache_salt,
                                        lora=self.lora(params.model))
        except ValueError as exc:
            return error_response(api.ApiError(400, str(exc)))
        rid, first_out = api.new_id(chat), []
        events = self._stamped(handle, first_out)
        self.enter()
        try:
            if params.stream:
                return await self._stream(request, params, rid, events, handle.stats, die)
            texts = ["" for _ in range(params.n)]
            async for ev in events:
                texts[ev.index] += ev.text
            return json_response(api.full_response(params, rid, texts, handle.stats))
        finally:
            handle.abort()  # no-op when finished; frees blocks when the client left
            self.leave()
            stats = handle.stats
            if stats.ttft is not None:
                server = first_out[0] - received if first_out else None
                self.served.append((rid, stats.ttft, server, stats.prompt_tokens,
                                    stats.cached_tokens))

    async def _stamped(self, handle: Any, first_out: list[float]) -> AsyncIterator[TokenEvent]:
        """The handle's events; the clock when the first one reached this server."""
        async for ev in handle:
            if not first_out:
                first_out.append(self.engine.clock.now())
            yield ev

    async def _stream(self, request: web.Request, params: api.Params, rid: str,
                      events: AsyncIterator[TokenEvent], stats: RequestStats,
                      die: bool) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        # the client may leave mid-stream: the caller aborts the request, as vLLM does
        with contextlib.suppress(ConnectionResetError):
            await self._write_stream(resp, params, rid, events, stats, die)
        return resp

    async def _write_stream(self, resp: web.StreamResponse, params: api.Params, rid: str,
                            events: AsyncIterator[TokenEvent], stats: RequestStats,
                            die: bool) -> None:
        created = int(time.time())
        started: set[int] = set()
        async for ev in events:
            first = ev.index not in started
            started.add(ev.index)
            if params.chat and first:
                await send_json(resp, api.chunk(params, rid, created, ev.index, "", None, True))
            await send_json(resp, api.chunk(params, rid, created, ev.index, ev.text, None))
            if die:
                _die()
            if ev.finish_reason is not None:
                await send_json(resp, api.chunk(params, rid, created, ev.index,
                                            None if params.chat else "", ev.finish_reason))
        if params.include_usage:
            await send_json(resp, api.usage_chunk(params, rid, created, stats))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()

    def enter(self) -> None:
        self.in_flight += 1
        self._idle.clear()

    def leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    async def drain(self, timeout_s: float = 30.0) -> None:
        """Refuse new requests and wait for in-flight ones to finish."""
        self.draining = True
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout_s)


def _die() -> None:
    """--fail-after: vanish like a crashed engine; open connections are cut."""
    log.error("prefix-sim: injected crash (--fail-after)")
    logging.shutdown()
    os._exit(17)
