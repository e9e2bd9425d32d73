"""Resuming a stream that broke after its first byte, on another worker.

The client has part of an answer; the next worker is asked to continue it, as vLLM allows:
a chat completion gets the text so far as a final assistant message with
``continue_final_message: true, add_generation_prompt: false``, a completion gets it
appended to its prompt, and ``max_tokens`` shrinks by what was produced. The new stream's
events are rewritten to the first stream's ``id`` and ``created`` and its role chunk is
dropped, so the client reads one coherent stream; its usage counts the whole answer.

What the client has seen is kept as the raw SSE bytes relayed, and parsed only when a
resume needs it (or every ``FOLD_BYTES``, to bound the memory of a long stream), so an
unbroken stream costs a buffer and one ``rfind`` per chunk. While a stream can be resumed
only whole SSE events are relayed, so a splice never lands inside one. Requests whose
continuation is not the same answer (``n`` > 1, logprobs, ``echo``, token-id prompts,
tool calls under way) are not resumed: they still end with an error event.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from router.routing.candidate import Candidate

FOLD_BYTES = 64 * 1024
EVENT_END = b"\n\n"
DONE = b"[DONE]"


def resumable(payload: Mapping[str, Any], chat: bool) -> bool:
    """Whether a continuation would be the same answer, continued."""
    if payload.get("n") not in (None, 1) or payload.get("best_of") not in (None, 1):
        return False
    if payload.get("logprobs") not in (None, False) or payload.get("top_logprobs"):
        return False
    if chat:
        return isinstance(payload.get("messages"), list)
    if payload.get("echo"):
        return False
    prompt = payload.get("prompt")
    return isinstance(prompt, str) or (isinstance(prompt, list) and len(prompt) == 1
                                       and isinstance(prompt[0], str))


@dataclass(slots=True, eq=False)
class Resumption:
    """A resumable stream across its legs: the request, the ranking, what the client has."""

    payload: Mapping[str, Any]
    chat: bool
    ranked: Sequence[Candidate]
    limit: int  # resumes allowed
    seen: Transcript = field(init=False)
    resumes: int = 0
    broken: set[str] = field(default_factory=set)  # workers whose leg broke

    def __post_init__(self) -> None:
        self.seen = Transcript(self.chat)

    def refusal(self) -> str | None:
        """Why this break is not resumed, if it is not."""
        if self.resumes >= self.limit:
            return "limit"
        if self.seen.tool_calls:
            return "tool_calls"
        return None

    def candidates(self) -> list[Candidate]:
        """The ranking's next workers: routable and not broken on this request."""
        return [c for c in self.ranked if c.id not in self.broken and c.worker.routable()]


class Transcript:
    """The SSE events the client has received, and what they add up to."""

    __slots__ = ("_raw", "_raw_bytes", "_tail", "chat", "created", "done", "finished",
                 "id", "parts", "produced", "tool_calls")

    def __init__(self, chat: bool) -> None:
        self.chat = chat
        self._tail = b""  # an event not complete yet: held back from the client
        self._raw: list[bytes] = []  # relayed, not parsed yet
        self._raw_bytes = 0
        self.parts: list[str] = []
        self.produced = 0  # content-bearing chunks: about a token each in vLLM's streams
        self.id: str | None = None
        self.created: int | None = None
        self.finished = False  # a finish_reason was relayed: the answer is whole
        self.done = False  # [DONE] was relayed
        self.tool_calls = False

    def feed(self, chunk: bytes) -> bytes:
        """The whole events in ``chunk`` (with what was held back), to relay now."""
        data = self._tail + chunk if self._tail else chunk
        end = data.rfind(EVENT_END)
        if end < 0:
            self._tail = data
            return b""
        end += len(EVENT_END)
        self._tail, out = data[end:], data[:end]
        self.relayed(out)
        return out

    def relayed(self, events: bytes) -> None:
        """Whole events the client got (from ``feed`` or a continuation's rewrite)."""
        self._raw.append(events)
        self._raw_bytes += len(events)
        if self._raw_bytes >= FOLD_BYTES:
            self.fold()

    def rest(self) -> bytes:
        """What was held back, for a stream that ended cleanly without a last blank line."""
        tail, self._tail = self._tail, b""
        return tail

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def fold(self) -> None:
        """Parse what was relayed since the last fold."""
        raw, self._raw, self._raw_bytes = b"".join(self._raw), [], 0
        for event in raw.split(EVENT_END):
            data = sse_data(event)
            if data is None:
                continue
            if data == DONE:
                self.done = True
                continue
            try:
                obj = orjson.loads(data)
            except orjson.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                self._read(obj)

    def _read(self, obj: dict[str, Any]) -> None:
        if self.id is None and isinstance(obj.get("id"), str):
            self.id, self.created = obj["id"], obj.get("created")
        for choice in obj.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            if self.chat:
                delta = choice.get("delta") or {}
                text = delta.get("content")
                if delta.get("tool_calls"):
                    self.tool_calls = True
            else:
                text = choice.get("text")
            if isinstance(text, str) and text:
                self.parts.append(text)
                self.produced += 1
            if choice.get("finish_reason"):
                self.finished = True


def sse_data(event: bytes) -> bytes | None:
    """The payload of an SSE event's ``data:`` line (vLLM sends one per event)."""
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            return line[5:].strip()
    return None


def continuation(payload: Mapping[str, Any], chat: bool, seen: Transcript
                 ) -> dict[str, Any] | None:
    """The request that continues ``seen`` on another worker; None when nothing is left."""
    body = dict(payload)
    text = seen.text
    for name in ("max_tokens", "max_completion_tokens"):
        limit = body.get(name)
        if isinstance(limit, int) and not isinstance(limit, bool):
            if limit - seen.produced < 1:
                return None
            body[name] = limit - seen.produced
    if not text:
        return body  # nothing but the role chunk reached the client: start again
    if chat:
        messages = list(body["messages"])
        last = messages[-1] if messages else None
        if (body.get("continue_final_message") and isinstance(last, dict)
                and isinstance(last.get("content"), str)):
            messages[-1] = {**last, "content": last["content"] + text}  # already a continuation
        else:
            messages.append({"role": "assistant", "content": text})
        body.update(messages=messages, continue_final_message=True,
                    add_generation_prompt=False)
    else:
        prompt = body["prompt"]
        body["prompt"] = (prompt if isinstance(prompt, str) else prompt[0]) + text
    return body


class Splice:
    """Rewrites a continuation's events into the stream the client is reading."""

    __slots__ = ("_created", "_id", "_produced", "_tail", "chat")

    def __init__(self, seen: Transcript) -> None:
        self.chat = seen.chat
        self._id = seen.id
        self._created = seen.created
        self._produced = seen.produced
        self._tail = b""

    def rewrite(self, chunk: bytes) -> bytes:
        data = self._tail + chunk
        end = data.rfind(EVENT_END)
        if end < 0:
            self._tail = data
            return b""
        end += len(EVENT_END)
        self._tail = data[end:]
        out = [self._event(e) for e in data[:end].split(EVENT_END) if e]
        return b"".join(e + EVENT_END for e in out if e is not None)

    def rest(self) -> bytes:
        tail, self._tail = self._tail, b""
        return tail

    def _event(self, event: bytes) -> bytes | None:
        data = sse_data(event)
        if data is None or data == DONE:
            return event
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return event
        if not isinstance(obj, dict):
            return event
        if self._id is not None and "id" in obj:
            obj["id"] = self._id
        if self._created is not None and "created" in obj:
            obj["created"] = self._created
        choices = obj.get("choices")
        if self.chat and isinstance(choices, list):
            kept = [c for c in choices if not _drop_role(c)]
            if choices and not kept:
                return None  # the new upstream's opening role chunk
            obj["choices"] = kept
        usage = obj.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            # the answer is the client's whole answer; its prompt, the one the client sent
            usage["completion_tokens"] += self._produced
            if isinstance(usage.get("prompt_tokens"), int):
                usage["prompt_tokens"] = max(0, usage["prompt_tokens"] - self._produced)
        return b"data: " + orjson.dumps(obj)


def _drop_role(choice: Any) -> bool:
    """Drop a chat choice's ``role``; True when that was all it said."""
    if not isinstance(choice, dict):
        return False
    delta = choice.get("delta")
    if isinstance(delta, dict):
        delta.pop("role", None)
        return not any(v not in (None, "") for v in delta.values()) and not choice.get(
            "finish_reason")
    return False
