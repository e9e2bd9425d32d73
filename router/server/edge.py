"""The HTTP edge below the app: limits on what a client may send, and errors in OpenAI's shape
even where the app never sees the request.

aiohttp answers a request it cannot parse (framing, oversized or too many headers, a bad
method) itself, in plain text, before any middleware runs; an OpenAI client then shows a
parse error instead of the reason. ``EdgeRunner`` serves the app with a request handler
whose protocol-level errors carry the same JSON body as the router's own
(``errors.error_body``) and a fresh X-Request-Id, and are logged as the client's fault (one
debug line) rather than as the router's (an error with a traceback per junk request). An
HTTP error aiohttp raises ahead of the middlewares (its Expect handler: 417) is shaped too,
and a body that cannot be decoded (broken chunks, a Content-Encoding it is not in) is a 400.

Slow clients (slowloris): a connection that has not sent a complete request head within
``client_timeout_s`` is closed (aiohttp's keep-alive timer, which also runs from the
moment a connection opens and while a head arrives byte by byte); a body that does not
arrive within ``client_timeout_s`` is answered 408 and the connection closed
(``body_deadline``). Header lines, header count and the request line are bounded
(``max_header_bytes``, ``max_headers``), answered 400/431 in OpenAI's shape.
"""

from __future__ import annotations

import asyncio
import logging
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler, RequestPayloadError

from router.client.contract import REQUEST_ID_HEADER
from router.config import RouterConfig
from router.server.errors import error_body, error_response, from_http_exception
from router.server.request_id import choose_request_id

log = logging.getLogger(__name__)

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
        if status >= 500:
            super().handle_error(request, status, exc, message)  # logs; refuses if bytes went out
        else:
            # the client's malformed request: one debug line, not aiohttp's error-level
            # traceback, so a client sending junk cannot flood the router's error log
            log.debug("unparseable request from %s: %s", request.remote, message or exc)
            if request.writer.output_size > 0:
                raise ConnectionError("the response has started: no error can follow")
        phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else ""
        text = message or phrase or "request failed"
        if status == 500:
            text = "internal error in the router"  # never a traceback to the client
        # a request that never parsed has no id of its own; a parsed one gets its own id
        # over this one (request_id.stamp_request_id runs as the response is prepared)
        response = web.Response(status=status, body=error_body(status, text, "bad_http"
                                                               if status < 500 else None),
                                content_type="application/json",
                                headers={REQUEST_ID_HEADER: choose_request_id(None)})
        response.force_close()
        return response

    def log_exception(self, *args: Any, **kw: Any) -> None:
        if isinstance(kw.get("exc_info"), RequestPayloadError):
            # a body the client broke (bad gzip, cut short), met again as aiohttp drains
            # it after the 400 body_deadline answered: the client's fault, not an error here
            self.log_debug(*args, **kw)
            return
        super().log_exception(*args, **kw)

    async def finish_response(self, request: Any, resp: web.StreamResponse,
                              start_time: float | None) -> tuple[web.StreamResponse, bool]:
        if isinstance(resp, web.HTTPException) and resp.status >= 400:
            # raised before any middleware could shape it: aiohttp's Expect handler runs
            # ahead of them (417 for an expectation other than 100-continue)
            resp = from_http_exception(resp)
        return await super().finish_response(request, resp, start_time)


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
            except (HttpProcessingError, RequestPayloadError) as exc:
                # framing broken (chunks), or a Content-Encoding the body is not in
                reason = exc.message if isinstance(exc, HttpProcessingError) else str(exc)
                response = error_response(400, f"request body unreadable: {reason}",
                                          "bad_http")
                response.force_close()
                return response
        return await handler(request)

    return middleware
