"""Request bodies: where the context goes, so that equal contexts are equal prefixes.

Chat layout: `[system?] + user("<context><separator><question>")`. The context leads the
user message (after the optional system prompt, which is the same for every request of an
application) so that, token for token, every request about the same documents starts with
the same prefix and the engine's prefix cache applies to all of it. One user message rather
than a context message plus a question message: chat templates of several models reject two
consecutive user turns, and a system-role context would be merged with or displaced by the
application's own system prompt differently per template.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_RESERVED_CHAT = frozenset({"messages", "model", "stream"})
_RESERVED_COMPLETION = frozenset({"prompt", "model", "stream"})


def chat_body(context: str, question: str, *, model: str, stream: bool, system: str | None,
              separator: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """An OpenAI `/v1/chat/completions` body with the context before the question."""
    _check_params(params, _RESERVED_CHAT)
    messages: list[dict[str, str]] = []
    if system is not None:
        messages.append({"role": "system", "content": system})
    content = f"{context}{separator}{question}" if context else question
    messages.append({"role": "user", "content": content})
    return {"model": model, "messages": messages, "stream": stream, **params}


def completion_body(context: str, prompt: str, *, model: str, stream: bool, separator: str,
                    params: Mapping[str, Any]) -> dict[str, Any]:
    """An OpenAI `/v1/completions` body whose prompt is the context, then the prompt."""
    _check_params(params, _RESERVED_COMPLETION)
    text = f"{context}{separator}{prompt}" if context else prompt
    return {"model": model, "prompt": text, "stream": stream, **params}


def _check_params(params: Mapping[str, Any], reserved: frozenset[str]) -> None:
    clash = reserved.intersection(params)
    if clash:
        raise TypeError(f"{sorted(clash)} are set by the SDK; pass them as arguments")
