"""The OpenAI Responses API: new responses routed by prompt, the rest pinned to their maker.

``POST /v1/responses`` without ``previous_response_id`` is keyed like a chat request on
``instructions`` then ``input`` (router/routing/prompt_views.py) and routed by the
policy. Everything that refers to a response by id (a follow-up with
``previous_response_id``, ``GET /v1/responses/{id}``, ``POST /v1/responses/{id}/cancel``)
goes to the worker that made it (router/server/response_owners.py) and only there: vLLM
keeps responses in that server's memory, so any other would answer 404 or, worse, start
a conversation without its history. When that worker is gone the router answers 404 in
OpenAI's shape itself, naming the worker, and sends the request nowhere else.
"""

from __future__ import annotations

from aiohttp import web

from router.fleet.workers import Worker
from router.routing import keys
from router.routing.prompt_views import responses_as_chat
from router.server.decide import Parsed, parse
from router.server.errors import RequestError, rejection_response
from router.server.handlers import Route, route
from router.server.request_id import request_id
from router.server.response_owners import RESPONSE_OWNERS
from router.server.state import ROUTER

CREATE = Route("/v1/responses", keys.chat_prompt_bytes, chat=True, view=responses_as_chat)
RETRIEVE = Route("/v1/responses/{response_id}", None, method="GET")
CANCEL = Route("/v1/responses/{response_id}/cancel", None)


async def create(request: web.Request) -> web.StreamResponse:
    owners = request.app[RESPONSE_OWNERS]
    try:
        parsed = parse(await request.read())
        previous = parsed.payload.get("previous_response_id")
        if previous is not None and not isinstance(previous, str):
            raise RequestError(400, "'previous_response_id' must be a string",
                               "invalid_previous_response_id")
        maker = await _maker(request, previous) if previous else None
    except RequestError as exc:
        return rejection_response(exc, {"X-Request-Id": request_id(request)})
    return await route(request, CREATE, parsed=parsed, pinned=maker, on_attempt=owners.watch)


async def retrieve(request: web.Request) -> web.StreamResponse:
    stream = request.query.get("stream", "false").lower() in ("1", "true")
    return await _by_id(request, RETRIEVE, stream)


async def cancel(request: web.Request) -> web.StreamResponse:
    return await _by_id(request, CANCEL, False)


async def _by_id(request: web.Request, spec: Route, stream: bool) -> web.StreamResponse:
    response_id = request.match_info["response_id"]
    try:
        maker = await _maker(request, response_id)
    except RequestError as exc:
        return rejection_response(exc, {"X-Request-Id": request_id(request)})
    upstream = request.path_qs  # the same path (and query: starting_after, stream)
    return await route(request, spec, parsed=Parsed(b"", {}, None, stream), pinned=maker,
                       upstream=upstream)


async def _maker(request: web.Request, response_id: str) -> Worker:
    """The worker holding the response, or a 404 saying why none can answer."""
    worker_id = await request.app[RESPONSE_OWNERS].owner(response_id)
    if worker_id is None:
        raise RequestError(404, f"Response with id '{response_id}' not found: no response "
                           "by that id was made through this router (or its record expired)",
                           "response_not_found")
    worker = request.app[ROUTER].pool.get(worker_id)
    if worker is None or not worker.healthy:
        why = "has left the fleet" if worker is None else "is down"
        raise RequestError(404, f"Response with id '{response_id}' not found: worker "
                           f"{worker_id}, which made it and alone held it, {why}",
                           "response_worker_gone")
    return worker
