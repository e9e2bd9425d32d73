"""The response a handler prepared before forwarding (a queued stream's keep-alives).

The proxy writes the upstream stream into it instead of preparing its own: a response's
status and headers go out once."""

from __future__ import annotations

from aiohttp import web

EARLY_RESPONSE: web.RequestKey[web.StreamResponse] | str = (
    web.RequestKey("early_response", web.StreamResponse)
    if hasattr(web, "RequestKey") else "early_response")
