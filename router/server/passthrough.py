"""The rest of vLLM's serving surface a RAG stack calls: one table, one handler each.

Rerank, score, pooling, classify, tokenize and detokenize reuse no prefix a router could
steer to (a reranker scores fresh query-document pairs; tokenizing touches no KV cache),
so they go to the least-loaded worker serving the model, original bytes, with failover
before the first byte like every other route. Anthropic's ``/v1/messages`` generates, so
it is keyed on ``system`` then ``messages`` like a chat request.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from router.routing import keys
from router.routing.prompt_views import messages_as_chat
from router.server.handlers import Route, route

PASS_THROUGH = (
    "/v1/rerank", "/rerank", "/v2/rerank",
    "/score", "/v1/score",
    "/pooling", "/classify",
    "/tokenize", "/detokenize",
    "/v1/messages/count_tokens",
)
MESSAGES = Route("/v1/messages", keys.chat_prompt_bytes, chat=True, view=messages_as_chat)


def add_routes(app: web.Application) -> None:
    for path in PASS_THROUGH:
        app.router.add_post(path, _handler(Route(path, None)))
    app.router.add_post(MESSAGES.path, _handler(MESSAGES))


def _handler(spec: Route) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handle(request: web.Request) -> web.StreamResponse:
        return await route(request, spec)

    handle.__doc__ = f"POST {spec.path}: " + ("keyed on its prompt" if spec.read_prompt
                                               else "least-loaded worker serving the model")
    return handle
