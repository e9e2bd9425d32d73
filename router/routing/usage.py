"""The engine's usage block, read from response bytes without parsing the JSON.

Only ``prompt_tokens`` and ``cached_tokens`` are needed, and they sit in the last
kilobyte of a body or in the final chunk of a stream, so a bounded regex search costs
microseconds where a full parse of a long answer would cost an allocation per field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_PROMPT = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')
_CACHED = re.compile(rb'"cached_tokens"\s*:\s*(\d+)')
MARK = b'"usage":{'
TAIL = 2048


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    cached_tokens: int


def find_usage(data: bytes) -> Usage | None:
    """Usage in ``data`` (a body or an SSE chunk), or None when it carries none."""
    start = data.rfind(MARK)
    if start < 0:
        start = data.rfind(b'"usage": {')
        if start < 0:
            return None
    window = data[start : start + TAIL]
    prompt = _PROMPT.search(window)
    if prompt is None:
        return None
    cached = _CACHED.search(window)
    return Usage(int(prompt.group(1)), int(cached.group(1)) if cached else 0)
