"""Where a request's server span is kept (no OpenTelemetry import: the request path reads
this key whether or not the ``otel`` extra is installed)."""

from typing import Any

from aiohttp import web

SPAN = web.RequestKey("prefix_router_span", Any)  # an opentelemetry Span
