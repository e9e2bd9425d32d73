"""vLLM's ``--api-key`` on the simulator: every route but the public ones wants the key.

As vLLM's AuthenticationMiddleware (checked against its source, 2026):
health probes, metrics and the version stay open; any other path needs
``Authorization: Bearer KEY`` (the scheme case-insensitive), else 401 with the body
``{"error": "Unauthorized"}``; OPTIONS passes. Keys are compared as SHA-256 digests in
constant time.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Awaitable, Callable

from aiohttp import web

PUBLIC_ENDPOINTS = ("/health", "/ping", "/load", "/version", "/metrics")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _public(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in PUBLIC_ENDPOINTS)


def api_key_middleware(api_key: str) -> Callable[[web.Request, Handler],
                                                 Awaitable[web.StreamResponse]]:
    wanted = hashlib.sha256(api_key.encode()).digest()

    def verified(header: str | None) -> bool:
        scheme, _, token = (header or "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        return secrets.compare_digest(hashlib.sha256(token.encode()).digest(), wanted)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method == "OPTIONS" or _public(request.path) or \
                verified(request.headers.get("Authorization")):
            return await handler(request)
        return web.json_response({"error": "Unauthorized"}, status=401)

    return middleware
