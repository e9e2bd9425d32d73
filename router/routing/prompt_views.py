"""Other APIs' prompts seen as a chat request, so one keyer (text or precise) serves them all.

Why a view rather than a keyer per API: vLLM renders a Responses request (``instructions``
then ``input``) and an Anthropic Messages request (``system`` then ``messages``) through
the same chat template as a chat completion, so the prompt the engine caches is the chat
prompt of these messages. Keying the view makes a Responses turn and a chat turn with the
same conversation share their chain, and lets precise mode tokenize them as vLLM does.
The view copies ``tools`` and ``cache_salt``: both change what the engine caches.
"""

from __future__ import annotations

from typing import Any

from router.routing.keys import InvalidPrompt

_KEPT = ("tools", "cache_salt", "chat_template_kwargs")


def _kept(body: dict[str, Any]) -> dict[str, Any]:
    return {k: body[k] for k in _KEPT if body.get(k) is not None}


def _text_parts(content: Any) -> Any:
    """Responses/Anthropic content parts (input_text, output_text, text) -> chat text parts."""
    if not isinstance(content, list):
        return content
    parts = []
    for part in content:
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        else:
            parts.append(part)
    return parts


def responses_as_chat(body: dict[str, Any]) -> dict[str, Any]:
    """``instructions`` as the system message, then ``input``: a string is one user turn,
    a list holds message items (role + content) and other items (function calls and
    their outputs), kept in order as they are."""
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise InvalidPrompt("'instructions' must be a string")
        messages.append({"role": "system", "content": instructions})
    items = body.get("input")
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
    elif isinstance(items, list) and items:
        for item in items:
            if not isinstance(item, dict):
                raise InvalidPrompt("each 'input' item must be an object")
            if isinstance(item.get("role"), str):
                messages.append({"role": item["role"],
                                 "content": _text_parts(item.get("content"))})
            else:
                messages.append({"role": str(item.get("type", "item")), "content": [item]})
    else:
        raise InvalidPrompt("'input' must be a string or a non-empty array")
    return {"messages": messages, **_kept(body)}


def messages_as_chat(body: dict[str, Any]) -> dict[str, Any]:
    """Anthropic Messages: ``system`` (a string or text blocks) as the system message,
    then ``messages`` as they are."""
    history = body.get("messages")
    if not isinstance(history, list) or not history:
        raise InvalidPrompt("'messages' must be a non-empty array")
    messages: list[Any] = []
    system = body.get("system")
    if system is not None:
        if not isinstance(system, str | list):
            raise InvalidPrompt("'system' must be a string or an array of text blocks")
        messages.append({"role": "system", "content": _text_parts(system)})
    for message in history:
        if isinstance(message, dict):
            message = {**message, "content": _text_parts(message.get("content"))}
        messages.append(message)
    return {"messages": messages, **_kept(body)}
