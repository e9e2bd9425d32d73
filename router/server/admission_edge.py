"""Admission at the edge: the request's tenant and priority, its wait, keep-alives, 429s.

``admit`` runs once a request is keyed and ranked. It returns the decision unchanged when
admission is off or the fleet has room; otherwise the request waits in the router and is
ranked again when it is let through (routed at dispatch, not at arrival). A queued stream
is answered 200 early and sent ``: queued`` SSE comments every ``queue_keepalive_s``, so
proxies in between keep the connection; what follows is then written into that same
response (router/server/proxy.py), a refusal as an SSE error event. A client that goes
away while queued cancels the handler, which takes the request out of the queue at once.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from router.admission.controller import Admission, AdmissionSettings
from router.admission.limits import TenantLimits
from router.admission.metrics import AdmissionMetrics
from router.admission.tenants import priority_of, tenant_of
from router.infra.supervisor import SUPERVISOR
from router.routing.errors import Rejected
from router.routing.policies.base import Decision
from router.routing.request import RoutingRequest
from router.server.early_response import EARLY_RESPONSE
from router.server.errors import error_body, rejection_response
from router.server.state import ROUTER

KEEPALIVE = b": queued\n\n"


async def admission_ctx(app: web.Application) -> AsyncIterator[None]:
    """With ``admission`` on: the controller, its tick and the tenant limits' sync."""
    state = app[ROUTER]
    cfg = state.config
    if not cfg.admission:
        yield
        return
    metrics = AdmissionMetrics(state.metrics.registry)
    limits = None
    if cfg.tenant_requests_per_s > 0 or cfg.tenant_tokens_per_s > 0:
        limits = TenantLimits(cfg.tenant_requests_per_s, cfg.tenant_tokens_per_s,
                              cfg.tenant_burst_s, state.metrics, metrics.limits_shared,
                              state.redis,
                              key_prefix=cfg.redis_key_prefix, replica_id=state.replica_id,
                              sync_s=cfg.limits_sync_s)
    settings = AdmissionSettings(cfg.max_queue_wait_s, cfg.engine_queue_s, cfg.saturation_kv,
                                 cfg.max_queue_requests, cfg.max_queue_tokens,
                                 cfg.fair_quantum_tokens)
    control = state.admission = Admission(settings, state.pool.candidates, metrics, limits)
    state.pipeline.on_first_byte.append(control.observe)  # a prefill ended: capacity freed
    supervisor = app[SUPERVISOR]
    supervisor.start("admission", control.run)
    if limits is not None and state.redis is not None:
        supervisor.start("limits", limits.run)
    yield
    await supervisor.stop("limits")
    await supervisor.stop("admission")


async def admit(request: web.Request, payload: dict[str, Any], stream: bool,
                routing: RoutingRequest, decision: Decision) -> Decision:
    state = request.app[ROUTER]
    control = state.admission
    if control is None or routing.source == "none":  # off, or embeddings: no prefill to queue
        return decision
    cfg = state.config
    tenant = tenant_of(request.headers, cfg.tenant_from, cfg.tenant_header)
    priority = priority_of(payload, request.headers)
    cost = max(0.0, routing.prompt_tokens - decision.ranked[0].cached_tokens)
    ticket = control.arrive(routing.model, tenant, priority, cost)
    if ticket is None:
        return decision
    interval = cfg.queue_keepalive_s if stream else math.inf
    try:
        while not await control.wait(ticket, interval):
            await _keep_alive(request)
    except BaseException:  # gone (cancelled), a keep-alive write failed, or shed
        control.leave(ticket)
        raise
    try:  # routed now, as the fleet stands at dispatch
        pipeline = state.pipeline
        routing.matches = None  # looked up again: the fleet changed while it waited
        candidates = await pipeline.candidates(routing, pipeline.fleet(routing.model))
        await pipeline.annotate(routing, candidates)
        return pipeline.rank(routing, candidates)
    finally:
        control.dispatched(ticket)  # the next goes once this one's try has begun


async def _keep_alive(request: web.Request) -> None:
    response = request.get(EARLY_RESPONSE)
    if response is None:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                               "Cache-Control": "no-cache"})
        await response.prepare(request)
        request[EARLY_RESPONSE] = response
    await response.write(KEEPALIVE)


async def refused(request: web.Request, exc: Rejected,
                  headers: dict[str, str]) -> web.StreamResponse:
    """The OpenAI-shaped error, or on a stream already answered, its SSE error event."""
    early = request.get(EARLY_RESPONSE)
    if early is None:
        return rejection_response(exc, headers)
    message = str(exc)
    if exc.retry_after is not None:
        message += f" (retry after {max(1, round(exc.retry_after))} s)"
    return await _end_early(early, error_body(exc.status, message, exc.code))


async def finished(request: web.Request, response: web.StreamResponse) -> web.StreamResponse:
    """The proxy's answer; an error answer to a stream already answered becomes an event."""
    early = request.get(EARLY_RESPONSE)
    if early is None or response is early:
        return response
    body = response.body if isinstance(response, web.Response) else None
    if not isinstance(body, bytes) or not body.startswith(b"{"):
        body = error_body(502, f"upstream answered {response.status}", "upstream_error")
    return await _end_early(early, body)


async def _end_early(early: web.StreamResponse, error: bytes) -> web.StreamResponse:
    await early.write(b"data: " + error + b"\n\ndata: [DONE]\n\n")
    await early.write_eof()
    return early
