"""The floor under any aiohttp gateway: a relay that reads the body and forwards it, no more.

``python -m bench overhead --targets aiohttp_relay,...`` runs it beside the routers, so
the hop's cost splits in one run into what aiohttp itself takes (one server request, one
client request, one response; uvloop, as the router runs) and what prefix-router adds on
top (key, residency, decision, accounting, retries, metrics). No headers are copied and
no error is shaped: it is a measuring stick, not a router.
``python -m bench.aiohttp_relay PORT UPSTREAM_URL``.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator

import aiohttp
import uvloop
from aiohttp import web

SESSION = web.AppKey("session", aiohttp.ClientSession)
UPSTREAM = web.AppKey("upstream", str)
JSON = {"Content-Type": "application/json"}
EVENTS = {"Content-Type": "text/event-stream"}


async def relay(request: web.Request) -> web.StreamResponse:
    """A whole body answered whole; an event stream relayed chunk by chunk as it comes."""
    body = await request.read()
    session = request.app[SESSION]
    async with session.post(request.app[UPSTREAM] + request.path, data=body,
                            headers=JSON) as upstream:
        if upstream.content_type != "text/event-stream":
            return web.Response(status=upstream.status, body=await upstream.read(),
                                headers=JSON)
        response = web.StreamResponse(status=upstream.status, headers=EVENTS)
        await response.prepare(request)
        async for chunk in upstream.content.iter_any():
            await response.write(chunk)
        await response.write_eof()
        return response


async def ready(_request: web.Request) -> web.Response:
    return web.json_response({"ready": True})


async def session_ctx(app: web.Application) -> AsyncIterator[None]:
    app[SESSION] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                         auto_decompress=False,
                                         cookie_jar=aiohttp.DummyCookieJar())
    yield
    await app[SESSION].close()


def main() -> None:
    port, upstream = int(sys.argv[1]), sys.argv[2]
    app = web.Application()
    app[UPSTREAM] = upstream
    app.cleanup_ctx.append(session_ctx)
    app.router.add_post("/v1/completions", relay)
    app.router.add_post("/v1/chat/completions", relay)
    app.router.add_get("/ready", ready)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None,
                loop=uvloop.new_event_loop())


if __name__ == "__main__":
    main()
