"""Deterministic generated tokens: same seed + prompt + choice index -> same stream."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

_SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "ta", "shi", "vo",
              "en", "ar", "is", "um", "pe", "do", "ga", "li")


def prompt_key(token_ids: Sequence[int]) -> bytes:
    """A short digest of the prompt that seeds its completions."""
    # one little-endian unsigned 64-bit word per token, packed at once
    return hashlib.blake2b(struct.pack(f"<{len(token_ids)}Q", *token_ids),
                           digest_size=16).digest()


def next_token(seed: int, key: bytes, index: int, position: int, vocab: int) -> int:
    """Pseudo-random token id, a pure function of its arguments."""
    digest = hashlib.blake2b(key + f":{seed}:{index}:{position}".encode(), digest_size=8).digest()
    return 1 + int.from_bytes(digest, "big") % (vocab - 1)


def token_text(token_id: int) -> str:
    """A pronounceable pseudo-word with a leading space (1-3 syllables)."""
    n = 1 + token_id % 3
    x = token_id // 3
    parts = []
    for _ in range(n):
        parts.append(_SYLLABLES[x % len(_SYLLABLES)])
        x //= len(_SYLLABLES)
    return " " + "".join(parts)
