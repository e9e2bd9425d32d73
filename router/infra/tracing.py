"""OpenTelemetry tracing, off unless ``--otel-endpoint`` names an OTLP/HTTP collector.

Why it is built this way: a platform team wants the router as one span in the trace its
client started, with what the router decided on it, and the worker's span as its child.
So the middleware continues the client's W3C ``traceparent`` (a root span without one),
opens a SERVER span, and hands the handler a request whose ``traceparent`` names that span,
which the proxy forwards to the worker as it forwards every header. The handler writes the
routing attributes on the span (router/server/route_trace.py). Spans leave in batches on
the SDK's exporter thread, never on the event loop. The provider and propagator are this
app's own (no OpenTelemetry globals), so two apps in one process trace independently.
Needs the ``otel`` extra; imported only when tracing is on.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web
from multidict import CIMultiDict
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from router.infra.trace_context import SPAN

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Tracing:
    def __init__(self, endpoint: str, service_name: str = "prefix-router",
                 schedule_delay_ms: int = 500) -> None:
        self.provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        self.provider.add_span_processor(BatchSpanProcessor(
            OTLPSpanExporter(endpoint=endpoint), schedule_delay_millis=schedule_delay_ms))
        self.tracer = self.provider.get_tracer("prefix-router")
        self.propagator = TraceContextTextMapPropagator()

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        parent = self.propagator.extract(request.headers)
        name = f"{request.method} {_route_name(request)}"
        with self.tracer.start_as_current_span(name, context=parent,
                                               kind=trace.SpanKind.SERVER) as span:
            span.set_attribute("http.request.method", request.method)
            span.set_attribute("url.path", request.path)
            outbound: dict[str, str] = {}
            self.propagator.inject(outbound)  # the current context: this span
            headers = CIMultiDict(request.headers)
            headers.update(outbound)
            traced = request.clone(headers=headers)
            traced[SPAN] = span
            response = await handler(traced)
            span.set_attribute("http.response.status_code", response.status)
            if response.status >= 500:
                span.set_status(trace.Status(trace.StatusCode.ERROR))
            return response

    async def close(self) -> None:
        """Flush what is batched (the exporter's HTTP is blocking: off the loop)."""
        await asyncio.to_thread(self.provider.shutdown)


def _route_name(request: web.Request) -> str:
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else request.path


TRACING = web.AppKey("tracing", Tracing)


async def tracing_ctx(app: web.Application) -> AsyncIterator[None]:
    yield
    await app[TRACING].close()
