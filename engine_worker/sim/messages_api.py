"""Anthropic's Messages API on the simulator, as vLLM 0.32 serves it at ``/v1/messages``:
``system`` then ``messages`` rendered with the chat template, streamed or not."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from aiohttp import web

from engine_worker.sim import openai_api as api
from engine_worker.sim.http import error_response, json_response, read_json, send_event

if TYPE_CHECKING:
    from engine_worker.sim.server import SimServer


class MessagesApi:
    def __init__(self, server: SimServer) -> None:
        self.server = server

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/messages", self.create)
        app.router.add_post("/v1/messages/count_tokens", self.count_tokens)

    def _prompt(self, body: dict[str, Any]) -> list[int]:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise api.ApiError(400, "'messages' must be a non-empty list")
        system = body.get("system")
        if isinstance(system, list):
            system = api.text_parts(system)
        head = [{"role": "system", "content": system}] if isinstance(system, str) else []
        return self.server.tokenizer.encode(api.render_chat(head + messages))

    async def count_tokens(self, request: web.Request) -> web.Response:
        try:
            ids = self._prompt(await read_json(request))
        except api.ApiError as err:
            return error_response(err)
        return json_response({"input_tokens": len(ids)})

    async def create(self, request: web.Request) -> web.StreamResponse:
        server = self.server
        try:
            body = await read_json(request)
            model = body.get("model") or server.model
            if model != server.model and model not in server.adapters:
                raise api.ApiError(404, f"The model `{model}` does not exist.", "NotFoundError")
            max_tokens = body.get("max_tokens")
            if not isinstance(max_tokens, int) or max_tokens < 1:
                raise api.ApiError(400, "'max_tokens' must be an integer >= 1")
            handle = server.submit(self._prompt(body), max_tokens, model,
                                   body.get("cache_salt"))
        except api.ApiError as err:
            return error_response(err)
        except ValueError as exc:
            return error_response(api.ApiError(400, str(exc)))
        message = {"id": "msg_" + uuid.uuid4().hex, "type": "message", "role": "assistant",
                   "model": model, "content": [], "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": 0, "output_tokens": 0}}
        server.enter()
        try:
            if not body.get("stream"):
                text = "".join([ev.text async for ev in handle])
                _finish(message, text, handle.stats)
                return json_response(message)
            return await self._stream(request, handle, message)
        finally:
            handle.abort()
            server.leave()

    async def _stream(self, request: web.Request, handle: Any,
                      message: dict[str, Any]) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        await send_event(resp, "message_start", {"type": "message_start", "message": message})
        await send_event(resp, "content_block_start", {
            "type": "content_block_start", "index": 0,
            "content_block": {"type": "text", "text": ""}})
        async for ev in handle:
            await send_event(resp, "content_block_delta", {
                "type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": ev.text}})
        await send_event(resp, "content_block_stop", {"type": "content_block_stop", "index": 0})
        stats = handle.stats
        await send_event(resp, "message_delta", {
            "type": "message_delta", "delta": {"stop_reason": "max_tokens"},
            "usage": {"input_tokens": stats.prompt_tokens,
                      "output_tokens": stats.completion_tokens}})
        await send_event(resp, "message_stop", {"type": "message_stop"})
        await resp.write_eof()
        return resp


def _finish(message: dict[str, Any], text: str, stats: Any) -> None:
    message["content"] = [{"type": "text", "text": text}]
    message["stop_reason"] = "max_tokens"
    message["usage"] = {"input_tokens": stats.prompt_tokens,
                        "output_tokens": stats.completion_tokens,
                        "cache_read_input_tokens": stats.cached_tokens}
