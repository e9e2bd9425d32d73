"""The HTTP edge below the app: limits on what a client may send, and errors in OpenAI's shape
even where the app never sees the request.

aiohttp answers a request it cannot parse (framing, oversized or too many headers, a bad
method) itself, in plain text, before any middleware runs; an OpenAI client then shows a
parse error instead of the reason. ``EdgeRunner`` serves the app with a request handler
whose protocol-level errors carry the same JSON body as the router's own
(``errors.error_body``).

Slow clients (slowloris): a connection that has not sent a complete request head within
``client_timeout_s`` is closed (aiohttp's keep-alive timer, which also runs from the
moment a connection opens and while a head arrives byte by byte); a body that does not
arrive within ``client_timeout_s`` is answered 408 and the connection closed
(``body_deadline``). Header lines, header count and the request line are bounded
(``max_header_bytes``, ``max_headers``), answered 400/431 in OpenAI's shape.
"""

from __future__ import annotations

import asyncio
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

from router.config import RouterConfig
from router.server.errors import error_body, error_response

# methods whose bodies the router reads (and so must receive in time)
_WITH_BODY = frozenset({"POST", "PUT", "PATCH"})


def edge_options(config: RouterConfig) -> dict[str, Any]:
    """aiohttp request-handler settings that bound what one client may hold."""
    return {"keepalive_timeout": config.client_timeout_s,
            # after an answer to a request whose body never came, read what is left for at
            # most this long (aiohttp's default, 10 s, would let a slow body hold on)
            "lingering_time": min(1.0, config.client_timeout_s),
            "max_line_size": config.max_header_bytes,
            "max_field_size": config.max_header_bytes,
            "max_headers": config.max_headers}


class _OpenAIErrorsHandler(RequestHandler):
    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        super().handle_error(request, status, exc, message)  # logs; refuses if bytes went out
        phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else ""
        text = message or phrase or "request failed"
        if status == 500:
            text = "internal error in the router"  # never a traceback to the client
        response = web.Response(status=status, body=error_body(status, text, "bad_http"
                                                               if status < 500 else None),
                                content_type="application/json")
        response.force_close()
        return response


class _EdgeServer(web.Server):
    def __call__(self) -> RequestHandler:
        return _OpenAIErrorsHandler(self, loop=self._loop, **self._kwargs)


class EdgeRunner(web.AppRunner):
    """``web.AppRunner`` whose connections answer protocol errors in OpenAI's shape."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _EdgeServer  # same state, one method different
        return server


def body_deadline(timeout_s: float) -> Any:
    """Middleware: read the body within ``timeout_s`` (handlers then get it from memory)."""

    @web.middleware
    async def middleware(request: web.Request, handler):  # type: ignore[no-untyped-def]
        if request.method in _WITH_BODY and request.body_exists:
            try:
                async with asyncio.timeout(timeout_s):
                    await request.read()
            except TimeoutError:
                response = error_response(408, f"request body not received within "
                                          f"{timeout_s:g}s", "client_timeout")
                response.force_close()
                return response
            except HttpProcessingError as exc:  # a body whose framing is broken (chunks)
                response = error_response(400, f"request body unreadable: {exc.message}",
                                          "bad_http")
                response.force_close()
                return response
        return await handler(request)

    return middleware
