"""Incremental Server-Sent Events decoding and OpenAI chunk helpers.

A hand-written decoder rather than aiohttp's line reader: aiohttp's `readline` raises on
lines longer than its buffer (a long completion chunk can exceed 64 KiB), and a pure
`feed(bytes) -> events` object is trivially testable without a server.
"""

from __future__ import annotations

from typing import Any

DONE = "[DONE]"


class SSEDecoder:
    """Turns arbitrary byte chunks into the `data` payloads of complete events.

    Handles `\\r\\n` line ends, multi-line `data:` fields (joined with `\\n`), comment lines
    (`: keep-alive`) and fields other than `data`, which OpenAI streams do not use."""

    def __init__(self) -> None:
        self._tail = b""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[str]:
        """Data payloads of the events completed by `chunk`, in order."""
        lines = (self._tail + chunk).split(b"\n")
        self._tail = lines.pop()  # incomplete last line (b"" when chunk ended with \n)
        out: list[str] = []
        for line in lines:
            self._line(line.removesuffix(b"\r"), out)
        return out

    def close(self) -> list[str]:
        """Payloads still pending at end of input (a server that omitted the blank line)."""
        out: list[str] = []
        if self._tail:
            self._line(self._tail.removesuffix(b"\r"), out)
            self._tail = b""
        self._line(b"", out)
        return out

    def _line(self, line: bytes, out: list[str]) -> None:
        if not line:
            if self._data:
                out.append("\n".join(self._data))
                self._data = []
            return
        if line.startswith(b":"):
            return
        field, _, value = line.partition(b":")
        if field == b"data":
            self._data.append(value.removeprefix(b" ").decode("utf-8", errors="replace"))


def delta_text(event: dict[str, Any]) -> str:
    """The text of choice 0 in a chat (`delta.content`) or completions (`text`) chunk."""
    return _choice_text(event, "delta")


def response_text(body: dict[str, Any]) -> str:
    """The text of choice 0 of a non-streamed chat or completions response."""
    return _choice_text(body, "message")


def _choice_text(obj: dict[str, Any], chat_field: str) -> str:
    """Choice 0's chat ``{chat_field}.content``, or its completions ``text``."""
    for choice in obj.get("choices") or ():
        if not isinstance(choice, dict) or choice.get("index", 0) != 0:
            continue
        chat = choice.get(chat_field)
        if isinstance(chat, dict):
            return chat.get("content") or ""
        return choice.get("text") or ""
    return ""
