"""OpenAI/vLLM request parsing and response shapes (pure functions, no I/O)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from engine_worker.sim.request import RequestStats


class ApiError(Exception):
    """An error returned in OpenAI's shape with an HTTP status."""

    def __init__(self, status: int, message: str, err_type: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.err_type,
                          "param": None, "code": self.status}}


@dataclass(frozen=True, slots=True)
class Params:
    chat: bool
    model: str
    prompt_text: str | None
    prompt_ids: list[int] | None
    max_tokens: int
    n: int
    stream: bool
    include_usage: bool
    cache_salt: str | None = None


def render_chat(messages: list[Any], add_generation_prompt: bool = True,
                continue_final_message: bool = False) -> str:
    """A fixed chat template: every message's role and content, in order, then the
    assistant's turn opened (``add_generation_prompt``), or, with ``continue_final_message``
    (vLLM's continuation of a partial reply), the last message left open to be continued."""
    if add_generation_prompt and continue_final_message:
        raise ApiError(400, "Cannot set both `continue_final_message` and "
                       "`add_generation_prompt` to True.")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list")
    parts = []
    for msg in messages:
        if not isinstance(msg, dict) or "role" not in msg:
            raise ApiError(400, "each message needs a 'role'")
        content = msg.get("content") or ""
        if isinstance(content, list):
            content = text_parts(content)
        if not isinstance(content, str):
            raise ApiError(400, "message content must be a string or a list of parts")
        parts.append(f"<|{msg['role']}|>\n{content}\n")
    if continue_final_message:
        parts[-1] = parts[-1][:-1]  # no end of turn: the text goes on from its last character
    elif add_generation_prompt:
        parts.append("<|assistant|>\n")
    return "".join(parts)


def text_parts(parts: list[Any]) -> str:
    """The text of a list of content parts (other part types carry none here)."""
    texts = [p.get("text", "") for p in parts if isinstance(p, dict)]
    if not all(isinstance(t, str) for t in texts):
        raise ApiError(400, "a content part's 'text' must be a string")
    return "".join(texts)


def chat_template_flags(body: dict[str, Any]) -> tuple[bool, bool]:
    """vLLM's ``add_generation_prompt`` (default true) and ``continue_final_message``."""
    add, cont = body.get("add_generation_prompt", True), body.get("continue_final_message", False)
    if not isinstance(add, bool) or not isinstance(cont, bool):
        raise ApiError(400, "'add_generation_prompt' and 'continue_final_message' must be "
                       "booleans")
    return add, cont


def _int_field(body: dict[str, Any], name: str, default: int, low: int) -> int:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ApiError(400, f"'{name}' must be an integer >= {low}")
    return value


def parse(body: Any, chat: bool, served_model: str,
          adapters: Collection[str] = ()) -> Params:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    model = body.get("model") or served_model
    if model != served_model and model not in adapters:
        raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError")
    prompt_text: str | None = None
    prompt_ids: list[int] | None = None
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "'messages' must be a non-empty list")
        prompt_text = render_chat(messages, *chat_template_flags(body))
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            prompt_text = prompt
        elif isinstance(prompt, list) and prompt and all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt):
            prompt_ids = list(prompt)
        else:
            raise ApiError(400, "'prompt' must be a string or a list of token ids")
    max_tokens = _int_field(body, "max_tokens", 16, 1)
    if chat and body.get("max_completion_tokens") is not None:
        max_tokens = _int_field(body, "max_completion_tokens", 16, 1)
    n = _int_field(body, "n", 1, 1)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, "'stream' must be a boolean")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise ApiError(400, "'stream_options' must be an object")
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise ApiError(400, "'cache_salt' must be a non-empty string")
    return Params(chat=chat, model=model, prompt_text=prompt_text, prompt_ids=prompt_ids,
                  max_tokens=max_tokens, n=n, stream=stream,
                  include_usage=bool(opts.get("include_usage", False)), cache_salt=salt)


def new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex


def usage(stats: RequestStats) -> dict[str, Any]:
    return {"prompt_tokens": stats.prompt_tokens,
            "completion_tokens": stats.completion_tokens,
            "total_tokens": stats.prompt_tokens + stats.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": stats.cached_tokens}}


def chunk(p: Params, rid: str, created: int, index: int, text: str | None,
          finish: str | None, first: bool = False) -> dict[str, Any]:
    """One streamed SSE chunk for one choice."""
    if p.chat:
        delta: dict[str, Any] = {}
        if first:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": index, "text": text or "", "logprobs": None,
                  "finish_reason": finish, "stop_reason": None}
        obj = "text_completion"
    out: dict[str, Any] = {"id": rid, "object": obj, "created": created, "model": p.model,
                           "choices": [choice]}
    if p.include_usage:
        out["usage"] = None
    return out


def usage_chunk(p: Params, rid: str, created: int, stats: RequestStats) -> dict[str, Any]:
    return {"id": rid, "object": "chat.completion.chunk" if p.chat else "text_completion",
            "created": created, "model": p.model, "choices": [], "usage": usage(stats)}


def full_response(p: Params, rid: str, texts: list[str], stats: RequestStats) -> dict[str, Any]:
    if p.chat:
        choices = [{"index": i, "message": {"role": "assistant", "content": t},
                    "logprobs": None, "finish_reason": "length", "stop_reason": None}
                   for i, t in enumerate(texts)]
        obj = "chat.completion"
    else:
        choices = [{"index": i, "text": t, "logprobs": None, "finish_reason": "length",
                    "stop_reason": None} for i, t in enumerate(texts)]
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": int(time.time()), "model": p.model,
            "choices": choices, "usage": usage(stats)}
