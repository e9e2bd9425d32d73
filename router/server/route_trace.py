"""What the router decided, written on the request's server span when tracing is on.

The span itself is router/infra/tracing.py's (opened by its middleware); this module only
names the routing attributes, so the request path pays one dict lookup when tracing is off.
"""

from __future__ import annotations

from aiohttp import web

from router.config import RouterConfig
from router.infra.trace_context import SPAN
from router.routing.accounting import Attempt
from router.routing.policies.base import Decision
from router.routing.request import RoutingRequest
from router.server.proxy import Outcome


def install(app: web.Application, config: RouterConfig) -> None:
    """Tracing on (``--otel-endpoint``): the middleware, and the exporter's last flush."""
    if not config.otel_endpoint:
        return
    try:
        from router.infra.tracing import TRACING, Tracing, tracing_ctx
    except ImportError as exc:
        raise SystemExit("tracing (--otel-endpoint) needs the 'otel' extra: "
                         "pip install 'prefix-router[otel]'") from exc
    tracing = Tracing(config.otel_endpoint, config.otel_service_name)
    app[TRACING] = tracing
    app.middlewares.insert(1, tracing.middleware)  # after request ids, around error shaping
    app.cleanup_ctx.append(tracing_ctx)


def record(request: web.Request, routing: RoutingRequest, decision: Decision,
           outcome: Outcome, attempts: list[Attempt]) -> None:
    span = request.get(SPAN)
    if span is None:
        return
    served = outcome.worker
    chosen = next((c for c in decision.ranked if served is not None and c.worker is served),
                  decision.ranked[0])
    span.set_attributes({
        "prefix_router.key_source": routing.source,
        "prefix_router.reason": decision.reason if len(attempts) <= 1 else "failover",
        "prefix_router.worker": served.id if served is not None else "",
        "prefix_router.predicted_cached_tokens": int(chosen.cached_tokens),
        "prefix_router.candidates": len(decision.ranked),
        "prefix_router.attempts": len(attempts),
        "prefix_router.model": routing.model or "",
    })
