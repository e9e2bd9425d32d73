"""OpenAI-compatible request handlers: parse once, key, rank, forward the original bytes.

Keys come from, in order: the client's X-Context-Hash header; precise mode (the model's
tokenizer and vLLM's block hashes matched against KV-event residency) when it applies;
else the approximate text chain. /metrics counts which (routing_key_source).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web

from router import keys
from router.errors import error_response
from router.state import ROUTER, RouterState

PromptReader = Callable[[dict[str, Any]], bytes]


CHAT_PATH = "/v1/chat/completions"


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
    reply = {"X-Request-Id": request_id}
    body = await request.read()
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return error_response(400, f"request body is not valid JSON: {exc}", "invalid_json",
                              headers=reply)
    if not isinstance(payload, dict):
        return error_response(400, "request body must be a JSON object", "invalid_body",
                              headers=reply)
    model = payload.get("model")
    if model is not None and not isinstance(model, str):
        return error_response(400, "'model' must be a string", "invalid_model", headers=reply)
    stream = payload.get("stream", False)
    if not isinstance(stream, bool):
        return error_response(400, "'stream' must be a boolean", "invalid_stream", headers=reply)
    try:
        key = _routing_key(request, state, payload, model, read_prompt)
    except keys.InvalidPrompt as exc:
        return error_response(400, str(exc), "invalid_prompt", headers=reply)
    if model is not None and not state.pool.knows_model(model):
        return error_response(404, f"model {model!r} is not served by any worker",
                              "model_not_found", headers=reply)
    candidates = state.pool.candidates(model)
    if not candidates:
        return error_response(503, "no healthy worker can take the request now",
                              "no_worker_available", retry_after=1, headers=reply)

    worker_headers: dict[str, dict[str, str]] | None = None
    precise = None
    if read_prompt is None:
        ranked, reason = sorted(candidates, key=lambda w: w.load), "least_loaded"
    else:
        if state.precise is not None and not key.explicit and state.policy.uses_residency:
            try:
                precise = await state.precise.key(payload, model, path == CHAT_PATH, candidates)
            except keys.InvalidPrompt as exc:
                return error_response(400, str(exc), "invalid_prompt", headers=reply)
        state.metrics.decision_mode.labels(
            "precise" if precise else "header" if key.explicit else "prompt").inc()
        if precise is not None:
            # Exact residency comes from the workers' KV events: nothing to record here.
            key = precise.key
            matches = state.precise.match(key.chain, [w.id for w in candidates])
        elif state.policy.uses_residency:
            matches = await state.residency.match(key.chain, [w.id for w in candidates])
        else:
            matches = {}
        decision = state.policy.rank(key, candidates, matches)
        ranked, reason = decision.ranked, decision.reason
        if precise is not None:
            if state.config.router_headers:
                worker_headers = state.precise.predicted_headers(precise, matches, ranked)
        elif state.policy.uses_residency:
            state.residency.record(ranked[0].id, key.chain)
        if state.policy.uses_residency:
            hit = matches.get(ranked[0].id, 0) > 0
            state.metrics.residency.labels("hit" if hit else "miss").inc()

    assert state.proxy is not None
    outcome = await state.proxy.forward(request, path, body, ranked, stream, request_id, reason,
                                        worker_headers)
    served = outcome.worker
    if served is not None and served is not ranked[0] and state.policy.uses_residency \
            and read_prompt is not None and precise is None:
        state.residency.record(served.id, key.chain)
    final_reason = reason if outcome.attempts <= 1 else "failover"
    state.metrics.decisions.labels(state.policy.name, final_reason).inc()
    state.metrics.requests.labels(path, served.id if served else "none",
                                  str(outcome.response.status)).inc()
    state.metrics.latency.labels(path).observe(time.perf_counter() - started)
    return outcome.response


def _routing_key(request: web.Request, state: RouterState, payload: dict[str, Any],
                 model: str | None, read_prompt: PromptReader | None) -> keys.RoutingKey:
    header = request.headers.get("X-Context-Hash")
    if header is not None:
        if not keys.valid_context_hash(header):
            raise keys.InvalidPrompt("X-Context-Hash must be 8-64 hexadecimal characters")
        return keys.explicit_key(header)
    if read_prompt is None:
        return keys.RoutingKey(key="", chain=(), explicit=False)
    cfg = state.config
    return keys.prompt_key(read_prompt(payload), model or "", cfg.block_chars, cfg.max_blocks,
                           cfg.key_blocks)


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
