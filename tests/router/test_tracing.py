"""Tracing (issue 16, acceptance 5): one trace id from the client's ``traceparent``,
through the router's server span (with its routing attributes), to the ``traceparent``
the worker receives; the span reaches a real OTLP/HTTP receiver, decoded here from
protobuf, and the SDK's in-memory exporter sees the same."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from router.config import RouterConfig
from router.infra.tracing import TRACING
from router.server.app import build_app
from router.server.state import ROUTER
from tests.router.sim_fleet import MODEL, sim_server

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
DOC = " ".join(f"chunk {i} of the retrieved context." for i in range(150))


async def test_one_trace_from_client_through_router_to_worker() -> None:
    exported: list[ExportTraceServiceRequest] = []
    received: list[str] = []

    async def otlp(request: web.Request) -> web.Response:
        assert request.content_type == "application/x-protobuf"
        message = ExportTraceServiceRequest()
        message.ParseFromString(await request.read())
        exported.append(message)
        return web.Response(body=b"", content_type="application/x-protobuf")

    @web.middleware
    async def remember_traceparent(request: web.Request, handler):
        if request.method == "POST":
            received.append(request.headers.get("traceparent", ""))
        return await handler(request)

    collector_app = web.Application()
    collector_app.router.add_post("/v1/traces", otlp)
    collector = TestServer(collector_app, host="127.0.0.1")
    sim = sim_server()
    worker_app = sim.app()
    worker_app.middlewares.append(remember_traceparent)
    worker = TestServer(worker_app, host="127.0.0.1")
    await collector.start_server()
    await worker.start_server()
    config = RouterConfig(workers=(("w0", str(worker.make_url("")).rstrip("/")),),
                          otel_endpoint=str(collector.make_url("/v1/traces")),
                          scrape_interval_s=0.0)
    app = build_app(config)
    memory = InMemorySpanExporter()
    app[TRACING].provider.add_span_processor(SimpleSpanProcessor(memory))
    router = TestServer(app, host="127.0.0.1")
    await router.start_server()
    await app[ROUTER].health.check_all()  # type: ignore[union-attr]
    body = {"model": MODEL, "max_tokens": 2,
            "messages": [{"role": "system", "content": DOC}, {"role": "user", "content": "q"}]}
    try:
        async with aiohttp.ClientSession() as http:
            for stream in (False, True):
                headers = {"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"}
                async with http.post(router.make_url("/v1/chat/completions"),
                                     json={**body, "stream": stream}, headers=headers) as resp:
                    assert resp.status == 200
                    await resp.read()
    finally:
        await router.close()  # flushes the batch to the collector
        await worker.close()
        await sim.engine.stop()
    spans = memory.get_finished_spans()
    assert len(spans) == 2
    for span, sent in zip(spans, received, strict=True):
        assert span.kind.name == "SERVER" and span.name == "POST /v1/chat/completions"
        assert f"{span.context.trace_id:032x}" == TRACE_ID
        assert span.parent is not None and f"{span.parent.span_id:016x}" == CLIENT_SPAN
        assert sent == f"00-{TRACE_ID}-{span.context.span_id:016x}-01"  # the router's span
        assert span.attributes["prefix_router.worker"] == "w0"
        assert span.attributes["prefix_router.key_source"] == "prompt"
        assert span.attributes["http.response.status_code"] == 200
    first, second = (dict(s.attributes) for s in spans)
    assert first["prefix_router.reason"] == "ring"
    assert first["prefix_router.predicted_cached_tokens"] == 0
    assert second["prefix_router.reason"] in ("warm", "home")
    assert second["prefix_router.predicted_cached_tokens"] > 0

    for _ in range(100):
        if sum(len(s.spans) for m in exported for r in m.resource_spans
               for s in r.scope_spans) >= 2:
            break
        await asyncio.sleep(0.02)
    decoded = [span for m in exported for r in m.resource_spans for s in r.scope_spans
               for span in s.spans]
    assert {span.trace_id.hex() for span in decoded} == {TRACE_ID}
    assert {span.parent_span_id.hex() for span in decoded} == {CLIENT_SPAN}
    attributes = {a.key: a.value for a in decoded[0].attributes}
    assert attributes["prefix_router.worker"].string_value == "w0"
    assert attributes["prefix_router.predicted_cached_tokens"].int_value == 0
    service = {a.key: a.value.string_value
               for a in exported[0].resource_spans[0].resource.attributes}
    assert service["service.name"] == "prefix-router"
    await collector.close()


def test_tracing_is_off_by_default() -> None:
    app = build_app(RouterConfig())
    assert TRACING not in app
