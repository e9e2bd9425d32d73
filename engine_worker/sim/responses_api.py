"""vLLM's Responses API on the simulator: create (streamed or not, background), retrieve,
cancel, and ``previous_response_id`` follow-ups.

Like vLLM (with VLLM_ENABLE_RESPONSES_API_STORE=1), responses live in this server's memory
only: another server answers 404 for them, which is what a router must route around.
The shapes follow vLLM 0.32's (openai's ``Response`` and its stream events); the prompt
is ``instructions`` as a system message, the previous response's conversation, then
``input``, rendered with the simulator's chat template.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from aiohttp import web

from engine_worker.sim import openai_api as api
from engine_worker.sim.http import error_response, json_response, read_json, send_event

if TYPE_CHECKING:
    from engine_worker.sim.server import SimServer

STORE_LIMIT = 10_000  # responses kept (oldest dropped first)


class ResponsesApi:
    def __init__(self, server: SimServer) -> None:
        self.server = server
        self.store: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.history: dict[str, list[dict[str, Any]]] = {}  # id -> its conversation
        self.tasks: dict[str, asyncio.Task[None]] = {}

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/responses", self.create)
        app.router.add_get("/v1/responses/{response_id}", self.retrieve)
        app.router.add_post("/v1/responses/{response_id}/cancel", self.cancel)

    async def create(self, request: web.Request) -> web.StreamResponse:
        server = self.server
        if server.draining:
            return error_response(api.ApiError(503, "server is draining",
                                               "ServiceUnavailableError"))
        try:
            body = await read_json(request)
            model = body.get("model") or server.model
            if model != server.model and model not in server.adapters:
                raise api.ApiError(404, f"The model `{model}` does not exist.", "NotFoundError")
            messages = self._conversation(body)
            ids = server.tokenizer.encode(api.render_chat(messages))
            max_tokens = body.get("max_output_tokens") or 16
            if not isinstance(max_tokens, int) or max_tokens < 1:
                raise api.ApiError(400, "'max_output_tokens' must be an integer >= 1")
            handle = server.submit(ids, max_tokens, model, body.get("cache_salt"))
        except api.ApiError as err:
            return error_response(err)
        except ValueError as exc:
            return error_response(api.ApiError(400, str(exc)))
        response = _response(body, model, "in_progress")
        if body.get("store", True):
            self._keep(response, messages)
        if body.get("background"):
            response["status"] = "queued"
            self.tasks[response["id"]] = asyncio.create_task(
                self._run(handle, response, messages))
            return json_response(response)
        if body.get("stream"):
            return await self._stream(request, handle, response, messages)
        await self._run(handle, response, messages)
        return json_response(response)

    async def retrieve(self, request: web.Request) -> web.Response:
        response = self.store.get(request.match_info["response_id"])
        if response is None:
            return _not_found(request.match_info["response_id"])
        return json_response(response)

    async def cancel(self, request: web.Request) -> web.Response:
        response_id = request.match_info["response_id"]
        response = self.store.get(response_id)
        if response is None:
            return _not_found(response_id)
        if response["status"] not in ("queued", "in_progress"):
            return error_response(api.ApiError(400, "Cannot cancel a synchronous response.",
                                               "invalid_request_error"))
        response["status"] = "cancelled"
        task = self.tasks.pop(response_id, None)
        if task is not None:
            task.cancel()
        return json_response(response)

    def _conversation(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = []
        if isinstance(body.get("instructions"), str):
            messages.append({"role": "system", "content": body["instructions"]})
        previous = body.get("previous_response_id")
        if previous is not None:
            if previous not in self.history:
                raise api.ApiError(404, f"Response with id '{previous}' not found.",
                                   "invalid_request_error")
            messages += [m for m in self.history[previous] if m["role"] != "system"]
        items = body.get("input")
        if isinstance(items, str):
            messages.append({"role": "user", "content": items})
        elif isinstance(items, list) and items:
            for item in items:
                if not isinstance(item, dict):
                    raise api.ApiError(400, "each 'input' item must be an object")
                messages.append({"role": str(item.get("role") or item.get("type") or "user"),
                                 "content": _text(item.get("content", item.get("output")))})
        else:
            raise api.ApiError(400, "'input' must be a string or a non-empty list")
        return messages

    def _keep(self, response: dict[str, Any], messages: list[dict[str, Any]]) -> None:
        self.store[response["id"]] = response
        self.history[response["id"]] = messages
        while len(self.store) > STORE_LIMIT:
            dropped, _ = self.store.popitem(last=False)
            self.history.pop(dropped, None)

    async def _run(self, handle: Any, response: dict[str, Any],
                   messages: list[dict[str, Any]]) -> None:
        self.server.enter()
        text = ""
        try:
            response["status"] = "in_progress"
            async for ev in handle:
                text += ev.text
            _finish(response, text, handle.stats)
            self.history[response["id"]] = [*messages, {"role": "assistant", "content": text}]
        finally:
            handle.abort()
            self.server.leave()
            self.tasks.pop(response["id"], None)

    async def _stream(self, request: web.Request, handle: Any, response: dict[str, Any],
                      messages: list[dict[str, Any]]) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        seq = 0

        async def event(kind: str, **fields: Any) -> None:
            nonlocal seq
            await send_event(resp, kind, {"type": kind, "sequence_number": seq, **fields})
            seq += 1

        item_id = "msg_" + uuid.uuid4().hex
        item = {"id": item_id, "type": "message", "role": "assistant", "status": "in_progress",
                "content": []}
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        await event("response.created", response=response)
        await event("response.in_progress", response=response)
        await event("response.output_item.added", output_index=0, item=item)
        await event("response.content_part.added", item_id=item_id, output_index=0,
                    content_index=0, part=part)
        self.server.enter()
        text = ""
        try:
            async for ev in handle:
                text += ev.text
                await event("response.output_text.delta", item_id=item_id, output_index=0,
                            content_index=0, delta=ev.text, logprobs=[])
        finally:
            handle.abort()
            self.server.leave()
        _finish(response, text, handle.stats)
        self.history[response["id"]] = [*messages, {"role": "assistant", "content": text}]
        done_part = {**part, "text": text}
        await event("response.output_text.done", item_id=item_id, output_index=0,
                    content_index=0, text=text, logprobs=[])
        await event("response.content_part.done", item_id=item_id, output_index=0,
                    content_index=0, part=done_part)
        await event("response.output_item.done", output_index=0, item=response["output"][0])
        await event("response.completed", response=response)
        await resp.write_eof()
        return resp


def _text(content: Any) -> str:
    if isinstance(content, list):
        return api.text_parts(content)
    return content if isinstance(content, str) else ""


def _response(body: dict[str, Any], model: str, status: str) -> dict[str, Any]:
    """A Response object; ``id`` first, as vLLM and OpenAI serialise it."""
    return {"id": "resp_" + uuid.uuid4().hex, "object": "response",
            "created_at": int(time.time()), "model": model, "status": status,
            "instructions": body.get("instructions"), "output": [],
            "previous_response_id": body.get("previous_response_id"),
            "background": bool(body.get("background")), "parallel_tool_calls": True,
            "tool_choice": "auto", "tools": [], "temperature": body.get("temperature", 1.0),
            "top_p": body.get("top_p", 1.0), "metadata": body.get("metadata"),
            "error": None, "incomplete_details": None, "usage": None}


def _finish(response: dict[str, Any], text: str, stats: Any) -> None:
    response["status"] = "completed"
    response["output"] = [{"id": "msg_" + uuid.uuid4().hex, "type": "message",
                           "role": "assistant", "status": "completed",
                           "content": [{"type": "output_text", "text": text,
                                        "annotations": [], "logprobs": []}]}]
    response["usage"] = {"input_tokens": stats.prompt_tokens,
                         "input_tokens_details": {"cached_tokens": stats.cached_tokens},
                         "output_tokens": stats.completion_tokens,
                         "output_tokens_details": {"reasoning_tokens": 0},
                         "total_tokens": stats.prompt_tokens + stats.completion_tokens}


def _not_found(response_id: str) -> web.Response:
    return error_response(api.ApiError(404, f"Response with id '{response_id}' not found.",
                                       "invalid_request_error"))
