"""OpenAI-compatible request handlers: the request path, read top to bottom in ``route``.

parse once -> fleet -> key -> candidates -> signals -> rank (router/server/decide.py,
shared with the endpoint picker) -> forward the original bytes -> complete; ``route`` drives every
routed API, each described by a ``Route``. The steps live in
router/routing/pipeline.py; this module only drives them and turns refusals into
OpenAI-shaped errors. Keys come from the client's X-Context-Hash
header (ring placement only; residency is matched on the prompt), precise mode (the
model's tokenizer and vLLM's block hashes against KV-event residency) when it applies,
else the approximate text chain; /metrics counts which (routing_key_source).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from router.client.contract import CONTEXT_HASH_HEADER
from router.fleet.workers import Worker
from router.routing.accounting import Attempt
from router.routing.candidate import Candidate
from router.routing.errors import Rejected
from router.routing.policies.base import Decision
from router.routing.request import RoutingRequest
from router.server import admission_edge as admission
from router.server import request_id as request_ids
from router.server import route_trace
from router.server.decide import (
    CHAT_PATH,
    NO_KEY,
    PROMPT_READERS,
    Parsed,
    PromptReader,
    View,
    decide,
    parse,
    prediction_headers,
)
from router.server.lora_loader import LORA_LOADER
from router.server.state import ROUTER


@dataclass(frozen=True, slots=True)
class Route:
    """How one API is keyed: ``read_prompt`` None passes it through to the least-loaded
    worker serving the model; ``view`` shows another API's body as a chat request
    (router/routing/prompt_views.py), keyed as chat; ``resumable`` streams may continue
    on another worker when they break (router/server/resume.py)."""

    path: str  # the router's path (a metrics label); upstream too unless ``route`` says
    read_prompt: PromptReader | None
    chat: bool = False
    view: View | None = None
    method: str = "POST"
    resumable: bool = False


CHAT = Route(CHAT_PATH, PROMPT_READERS[CHAT_PATH], chat=True, resumable=True)
COMPLETIONS = Route("/v1/completions", PROMPT_READERS["/v1/completions"], resumable=True)
EMBEDDINGS = Route("/v1/embeddings", None)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await route(request, CHAT)


async def completions(request: web.Request) -> web.StreamResponse:
    return await route(request, COMPLETIONS)


async def embeddings(request: web.Request) -> web.StreamResponse:
    """Passed through to the least-loaded worker serving the model: no prefix to reuse."""
    return await route(request, EMBEDDINGS)


async def route(request: web.Request, spec: Route, *, parsed: Parsed | None = None,
                pinned: Worker | None = None, upstream: str | None = None,
                on_attempt: Callable[[Attempt], None] | None = None) -> web.StreamResponse:
    """The request path. ``pinned`` sends it to that worker alone (state held in one
    engine's memory: no other can answer), at ``upstream`` when given; ``on_attempt``
    sees each try (the Responses API learns which worker made a response id)."""
    state = request.app[ROUTER]
    pipeline = state.pipeline
    started = time.perf_counter()
    request_id = request_ids.request_id(request)
    path = spec.path
    try:
        parsed = parsed or parse(await request.read())
        if pinned is not None:
            routing = RoutingRequest(NO_KEY, 0.0, 1.0, parsed.model, source="none")
            decision = Decision([Candidate(pinned)], "pinned")
        else:
            if (loader := request.app.get(LORA_LOADER)) is not None:
                await loader.ensure(parsed.model, state.session)  # type: ignore[arg-type]
            routed = await decide(pipeline, parsed.body, path, spec.read_prompt,
                                  request.headers.get(CONTEXT_HASH_HEADER), parsed=parsed,
                                  chat=spec.chat, view=spec.view)
            parsed, routing = routed.parsed, routed.routing
            decision = await admission.admit(request, parsed.payload, parsed.stream, routing,
                                             routed.decision)
    except Rejected as exc:  # RequestError is one too
        return await admission.refused(request, exc, {"X-Request-Id": request_id})

    attempts: list[Attempt] = []  # the proxy's tries, also when the client's leaving
    # cancels this handler mid-forward

    def begin(candidate: Candidate) -> Attempt:
        attempt = pipeline.attempt(routing, candidate, parsed.stream, may_hold=True)
        if on_attempt is not None:
            on_attempt(attempt)
        return attempt

    assert state.proxy is not None
    try:
        outcome = await state.proxy.forward(
            request, upstream or path, parsed.body, decision.ranked, parsed.stream,
            request_id, decision.reason, begin, attempts,
            _predicted_headers(routing, decision.ranked) if state.config.router_headers
            else None, parsed.payload if parsed.stream and spec.resumable else None,
            spec.method)
    except asyncio.CancelledError:
        # the client left (aiohttp cancels the handler): a stream it was answering counts
        # as the 200 it got, anything else as nginx's 499 (client closed request)
        served = next((a.worker for a in reversed(attempts) if a.first_byte_s is not None),
                      None)
        _count(request, path, decision.reason, attempts, served,
               200 if served is not None and parsed.stream else 499, started)
        raise
    finally:  # a client gone at [DONE] cancels the handler after the usage was relayed
        pipeline.complete(attempts)
    route_trace.record(request, routing, decision, outcome, attempts)
    _count(request, path, decision.reason, attempts, outcome.worker,
           outcome.response.status, started)
    return await admission.finished(request, outcome.response)


def _count(request: web.Request, path: str, reason: str, attempts: list[Attempt],
           served: Worker | None, status: int, started: float) -> None:
    state = request.app[ROUTER]
    metrics = state.metrics
    child = metrics.child
    child(metrics.decisions, state.pipeline.policy.name,
          reason if len(attempts) <= 1 else "failover").inc()
    child(metrics.requests, path, served.id if served else "none", str(status)).inc()
    child(metrics.latency, path).observe(time.perf_counter() - started)


def _predicted_headers(routing: RoutingRequest, ranked: list[Candidate]
                       ) -> dict[str, dict[str, str]] | None:
    """Each ranked worker's prediction headers (decide.prediction_headers), for whichever
    of them serves."""
    headers = {c.id: mine for c in ranked if (mine := prediction_headers(c, routing.exact))}
    return headers or None


async def list_models(request: web.Request) -> web.Response:
    pool = request.app[ROUTER].pool
    data = [{"id": m, "object": "model", "created": 0, "owned_by": "prefix-router",
             **({"parent": adapter.parent} if (adapter := pool.adapter(m)) else {})}
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
