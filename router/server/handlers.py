"""OpenAI-compatible request handlers: the request path, read top to bottom in ``_route``.

parse once -> candidates -> key -> signals -> rank (router/server/decide.py, shared with
the endpoint picker) -> forward the original bytes -> complete. The steps live in
router/routing/pipeline.py; this module only drives them and turns refusals into
OpenAI-shaped errors. Keys come from the client's X-Context-Hash
header (ring placement only; residency is matched on the prompt), precise mode (the
model's tokenizer and vLLM's block hashes against KV-event residency) when it applies,
else the approximate text chain; /metrics counts which (routing_key_source).
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from aiohttp import web

from router.client.contract import CONTEXT_HASH_HEADER
from router.routing.candidate import Candidate
from router.routing.errors import Rejected
from router.routing.request import RoutingRequest
from router.server import request_id as request_ids
from router.server.decide import CHAT_PATH, PROMPT_READERS, decide
from router.server.errors import rejection_response
from router.server.state import ROUTER

PREDICTED_HEADER = "X-Prefix-Router-Predicted-Cached"


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _route(request, CHAT_PATH)


async def completions(request: web.Request) -> web.StreamResponse:
    return await _route(request, "/v1/completions")


async def embeddings(request: web.Request) -> web.StreamResponse:
    """Passed through to the least-loaded worker serving the model: no prefix to reuse."""
    return await _route(request, "/v1/embeddings")


async def _route(request: web.Request, path: str) -> web.StreamResponse:
    state = request.app[ROUTER]
    pipeline = state.pipeline
    started = time.perf_counter()
    request_id = request_ids.request_id(request)
    try:
        routed = await decide(pipeline, await request.read(), path, PROMPT_READERS[path],
                              request.headers.get(CONTEXT_HASH_HEADER))
    except Rejected as exc:  # RequestError is one too
        return rejection_response(exc, {"X-Request-Id": request_id})
    parsed, routing, decision = routed.parsed, routed.routing, routed.decision

    assert state.proxy is not None
    outcome = await state.proxy.forward(
        request, path, parsed.body, decision.ranked, parsed.stream, request_id,
        decision.reason, lambda c: pipeline.attempt(routing, c, parsed.stream),
        _predicted_headers(routing, decision.ranked) if state.config.router_headers else None,
        parsed.payload if parsed.stream else None)
    pipeline.complete(outcome.attempts)

    served, metrics = outcome.worker, state.metrics
    reason = decision.reason if len(outcome.attempts) <= 1 else "failover"
    metrics.decisions.labels(pipeline.policy.name, reason).inc()
    metrics.requests.labels(path, served.id if served else "none",
                            str(outcome.response.status)).inc()
    metrics.latency.labels(path).observe(time.perf_counter() - started)
    return outcome.response


def _predicted_headers(routing: RoutingRequest, ranked: list[Candidate]
                       ) -> dict[str, dict[str, str]] | None:
    """Precise mode tells the client what the engine should find cached (exact residency)."""
    if not routing.exact:
        return None
    return {c.id: {PREDICTED_HEADER: str(int(c.cached_tokens))} for c in ranked}


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
    healthy = pool.healthy_count()
    body = {"ready": healthy > 0, "healthy_workers": healthy, "workers": len(pool)}
    return web.json_response(body, status=200 if healthy else 503)


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=request.app[ROUTER].metrics.render(),
                        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


def _dumps(obj: Any) -> str:
    return orjson.dumps(obj).decode()
