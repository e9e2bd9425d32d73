"""Errors in OpenAI's shape, so any OpenAI client surfaces them properly."""

from __future__ import annotations

import orjson
from aiohttp import web

from router.routing.errors import Rejected

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}


def error_body(status: int, message: str, code: str | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": _TYPES.get(status, "api_error"),
                                   "param": None, "code": code}})


def upstream_error_body(status: int, body: bytes) -> bytes | None:
    """A worker's error answer in OpenAI's shape, or None when it already is one. vLLM's
    own routes answer some errors as FastAPI's ``{"detail": ...}`` (a route the model does
    not serve) or ``{"error": "Unauthorized"}`` (its --api-key guard): an OpenAI client
    would surface neither properly. The worker's words are kept as the message."""
    try:
        parsed = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict):
        error = parsed.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return None
        words = parsed.get("detail", error)
        message = words if isinstance(words, str) else orjson.dumps(words or parsed).decode()
    else:
        message = body.decode("utf-8", "replace").strip()
    return error_body(status, f"worker answered {status}: {message[:500] or 'no body'}",
                      "upstream_error")


def error_response(status: int, message: str, code: str | None = None,
                   retry_after: float | None = None,
                   headers: dict[str, str] | None = None) -> web.Response:
    all_headers = dict(headers or {})
    if retry_after is not None:
        all_headers["Retry-After"] = str(max(1, round(retry_after)))
    return web.Response(status=status, body=error_body(status, message, code),
                        content_type="application/json", headers=all_headers)


def sse_error_event(status: int, message: str, code: str | None = None) -> bytes:
    """The event that ends a stream cut after its first byte: clients see why, never silence."""
    return b"data: " + error_body(status, message, code) + b"\n\ndata: [DONE]\n\n"


def from_http_exception(exc: web.HTTPException) -> web.Response:
    """One of aiohttp's HTTP errors (404, 405, 413, 417, ...) in OpenAI's shape."""
    message = exc.text or exc.reason
    if exc.status == 413:
        message = "request body too large"
    return error_response(exc.status, message, code=exc.reason.lower().replace(" ", "_"))


@web.middleware
async def openai_errors(request: web.Request, handler):  # type: ignore[no-untyped-def]
    """aiohttp's own 404/405/413 (and any HTTPException) in OpenAI's shape."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return from_http_exception(exc)


class RequestError(Rejected):
    """A request the router answers itself, before any worker sees it (the edge's own
    refusals; routing's are ``Rejected``, rendered the same way)."""


def rejection_response(exc: Rejected, headers: dict[str, str]) -> web.Response:
    return error_response(exc.status, str(exc), exc.code, exc.retry_after, headers)
