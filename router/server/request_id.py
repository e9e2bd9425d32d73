"""One request id per request, chosen at the edge, on every response (errors included).

Why a middleware plus a prepare hook: the middleware runs before any handler, so handlers
and the proxy read one id (``request_id(request)``) instead of each deriving their own;
the ``on_response_prepare`` hook runs as any response's headers are written, so the id
reaches the client on aiohttp's own 404/405/413, on streams a handler prepared itself, and
on the bare 500 aiohttp writes for an unhandled exception.

An incoming ``X-Request-Id`` is reused only when it is short and plain (at most 128 of
``[A-Za-z0-9._:-]``): the id goes into logs and upstream requests, so an oversized or odd
one is replaced by 128 fresh random bits in hex (a uuid4's size; ``os.urandom`` costs a
fraction of building a ``UUID``), never forwarded.
"""

from __future__ import annotations

import os
import re

from aiohttp import web

from router.client.contract import REQUEST_ID_HEADER

_SANE = re.compile(r"[A-Za-z0-9._:-]{1,128}")

# aiohttp >= 3.14 has typed request keys; before that a plain string key does the same job.
REQUEST_ID: web.RequestKey[str] | str = (web.RequestKey("request_id", str)
                                         if hasattr(web, "RequestKey") else "request_id")


def choose_request_id(incoming: str | None) -> str:
    """The client's id when it is sane, else a new one."""
    if incoming is not None and _SANE.fullmatch(incoming):
        return incoming
    return os.urandom(16).hex()


def request_id(request: web.Request) -> str:
    """This request's id (chosen by the middleware; chosen now if it did not run)."""
    chosen = request.get(REQUEST_ID)
    if chosen is None:
        chosen = request[REQUEST_ID] = choose_request_id(request.headers.get(REQUEST_ID_HEADER))
    return chosen


@web.middleware
async def request_ids(request: web.Request, handler):  # type: ignore[no-untyped-def]
    """Choose the id before the handler runs (first in the middleware list)."""
    request[REQUEST_ID] = choose_request_id(request.headers.get(REQUEST_ID_HEADER))
    return await handler(request)


async def stamp_request_id(request: web.BaseRequest, response: web.StreamResponse) -> None:
    """``on_response_prepare``: every response leaves with this request's id."""
    if isinstance(request, web.Request):
        response.headers[REQUEST_ID_HEADER] = request_id(request)
