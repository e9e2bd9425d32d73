"""The simulator's HTTP answers: JSON bodies, errors in vLLM's shape, SSE events."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from engine_worker.sim import openai_api as api


def json_response(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(obj), status=status, content_type="application/json")


def error_response(err: api.ApiError) -> web.Response:
    return json_response(err.body(), status=err.status)


async def send_json(resp: web.StreamResponse, obj: dict[str, Any]) -> None:
    """One ``data:`` event (OpenAI chat/completions streams)."""
    await resp.write(b"data: " + orjson.dumps(obj) + b"\n\n")


async def send_event(resp: web.StreamResponse, event: str, obj: dict[str, Any]) -> None:
    """One named event (Responses and Anthropic Messages streams)."""
    await resp.write(b"event: " + event.encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n")


async def read_json(request: web.Request) -> dict[str, Any]:
    """The body as a JSON object, or an ApiError 400."""
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        raise api.ApiError(400, "invalid JSON body") from None
    if not isinstance(body, dict):
        raise api.ApiError(400, "the request body must be a JSON object")
    return body
