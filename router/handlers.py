"""OpenAI-compatible request handlers: parse once, key, rank, forward the original bytes.

Keys come from, in order: the client's X-Context-Hash header; precise mode (the model's
tokenizer and vLLM's block hashes matched against KV-event residency) when it applies;
else the approximate text chain. /metrics counts which (routing_key_source).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from router import keys
from router.errors import RequestError
from router.state import ROUTER, RouterState
from router.workers import Worker

PromptReader = Callable[[dict[str, Any]], bytes]
CHAT_PATH = "/v1/chat/completions"


@dataclass(frozen=True, slots=True)
class Parsed:
    body: bytes  # forwarded unchanged
    payload: dict[str, Any]
    model: str | None
    stream: bool


@dataclass(slots=True)
class Plan:
    ranked: list[Worker]
    reason: str
    chain: tuple[bytes, ...] = ()  # recorded as warm on the worker that serves it
    worker_headers: dict[str, dict[str, str]] | None = None


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _route(request, CHAT_PATH, keys.chat_prompt_bytes)


async def completions(request: web.Request) -> web.StreamResponse:
    return await _route(request, "/v1/completions", keys.completion_prompt_bytes)


async def embeddings(request: web.Request) -> web.StreamResponse:
    """Passed through to the least-loaded worker serving the model: no prefix to reuse."""
    return await _route(request, "/v1/embeddings", None)


async def _route(request: web.Request, path: str,
                 read_prompt: PromptReader | None) -> web.StreamResponse:
    state = request.app[ROUTER]
    started = time.perf_counter()
    request_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex
    try:
        parsed = _parse(await request.read())
        candidates = _candidates(state, parsed.model)
        if read_prompt is None:
            plan = Plan(sorted(candidates, key=lambda w: w.load), "least_loaded")
        else:
            plan = await _plan(request, state, path, parsed, read_prompt, candidates)
    except RequestError as exc:
        return exc.response({"X-Request-Id": request_id})

    assert state.proxy is not None
    outcome = await state.proxy.forward(request, path, parsed.body, plan.ranked, parsed.stream,
                                        request_id, plan.reason, plan.worker_headers)
    served = outcome.worker
    if plan.chain and served is not None and served is not plan.ranked[0]:
        state.residency.record(served.id, plan.chain)  # the failover worker is warm now
    metrics = state.metrics
    metrics.decisions.labels(state.policy.name,
                             plan.reason if outcome.attempts <= 1 else "failover").inc()
    metrics.requests.labels(path, served.id if served else "none",
                            str(outcome.response.status)).inc()
    metrics.latency.labels(path).observe(time.perf_counter() - started)
    return outcome.response


def _parse(body: bytes) -> Parsed:
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise RequestError(400, f"request body is not valid JSON: {exc}", "invalid_json") from None
    if not isinstance(payload, dict):
        raise RequestError(400, "request body must be a JSON object", "invalid_body")
    model = payload.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError(400, "'model' must be a string", "invalid_model")
    stream = payload.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError(400, "'stream' must be a boolean", "invalid_stream")
    return Parsed(body, payload, model, stream)


def _candidates(state: RouterState, model: str | None) -> list[Worker]:
    if model is not None and not state.pool.knows_model(model):
        raise RequestError(404, f"model {model!r} is not served by any worker",
                           "model_not_found")
    candidates = state.pool.candidates(model)
    if not candidates:
        raise RequestError(503, "no healthy worker can take the request now",
                           "no_worker_available", retry_after=1)
    return candidates


async def _plan(request: web.Request, state: RouterState, path: str, parsed: Parsed,
                read_prompt: PromptReader, candidates: list[Worker]) -> Plan:
    """Key the request, read residency once, rank; note what to record as warm."""
    policy, ids = state.policy, [w.id for w in candidates]
    matcher = state.precise if policy.uses_residency else None
    try:
        header = _header_key(request)
        precise = None
        if header is None and matcher is not None:
            precise = await matcher.key(parsed.payload, parsed.model, path == CHAT_PATH,
                                        candidates)
        if header is not None:
            key, source = header, "header"
        elif precise is not None:
            key, source = precise.key, "precise"
        else:
            cfg = state.config
            key = keys.prompt_key(read_prompt(parsed.payload), parsed.model or "",
                                  cfg.block_chars, cfg.max_blocks, cfg.key_blocks)
            source = "prompt"
    except keys.InvalidPrompt as exc:
        raise RequestError(400, str(exc), "invalid_prompt") from None
    state.metrics.decision_mode.labels(source).inc()
    if not policy.uses_residency:
        decision = policy.rank(key, candidates, {})
        return Plan(decision.ranked, decision.reason)
    if precise is not None and matcher is not None:  # exact residency from KV events
        matches = matcher.match(key.chain, ids)
    else:
        matches = await state.residency.match(key.chain, ids)
    decision = policy.rank(key, candidates, matches)
    chosen = decision.ranked[0]
    state.metrics.residency.labels("hit" if matches.get(chosen.id, 0) else "miss").inc()
    if precise is not None and matcher is not None:
        headers = (matcher.predicted_headers(precise, matches, decision.ranked)
                   if state.config.router_headers else None)
        return Plan(decision.ranked, decision.reason, worker_headers=headers)
    state.residency.record(chosen.id, key.chain)
    return Plan(decision.ranked, decision.reason, chain=key.chain)


def _header_key(request: web.Request) -> keys.RoutingKey | None:
    header = request.headers.get("X-Context-Hash")
    if header is None:
        return None
    if not keys.valid_context_hash(header):
        raise keys.InvalidPrompt("X-Context-Hash must be 8-64 hexadecimal characters")
    return keys.explicit_key(header)


async def list_models(request: web.Request) -> web.Response:
    pool = request.app[ROUTER].pool
    data = [{"id": m, "object": "model", "created": 0, "owned_by": "prefix-router"}
            for m in pool.models()]
    return web.json_response({"object": "list", "data": data}, dumps=_dumps)


async def health(request: web.Request) -> web.Response:
    """Liveness: the process serves; readiness is /ready."""
    return web.json_response({"status": "ok"})


async def ready(request: web.Request) -> web.Response:
    pool = request.app[ROUTER].pool
    healthy = sum(1 for w in pool if w.healthy and not w.draining)
    body = {"ready": healthy > 0, "healthy_workers": healthy, "workers": len(pool)}
    return web.json_response(body, status=200 if healthy else 503)


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=request.app[ROUTER].metrics.render(),
                        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


def _dumps(obj: Any) -> str:
    return orjson.dumps(obj).decode()
