"""Deterministic synthetic text whose token count under the simulator's tokenizer is exact.

Every word is a space followed by 2-5 lowercase letters, which the simulator's tokenizer
(engine_worker/sim/tokenizer.py) maps to exactly one token, and a word boundary never
merges across concatenation. So ``words(n)`` is n tokens, the tokens of a concatenation
are the concatenation of the tokens, and a prompt's block structure can be computed
offline without running a server.
"""

from __future__ import annotations

import random
from functools import lru_cache

_LETTERS = "abcdefghijklmnopqrstuvwxyz"


@lru_cache(maxsize=1)
def vocabulary() -> tuple[str, ...]:
    """A fixed 8,192-word vocabulary (the same on every machine and Python version)."""
    rng = random.Random(20240601)
    return tuple(" " + "".join(rng.choice(_LETTERS) for _ in range(rng.randint(2, 5)))
                 for _ in range(8192))


def words(n: int, rng: random.Random) -> str:
    """n tokens of pseudo-text drawn from rng."""
    return "".join(rng.choices(vocabulary(), k=n)) if n > 0 else ""


@lru_cache(maxsize=16384)
def block_text(namespace: str, block_id: int, n: int) -> str:
    """The fixed text of a named block: the same (namespace, id, n) always gives the same text."""
    return words(n, random.Random(f"{namespace}:{block_id}"))


def truncate_tokens(text: str, n: int) -> str:
    """The first n tokens (words) of text built by ``words``."""
    if n <= 0:
        return ""
    count = 0
    for i, ch in enumerate(text):
        if ch == " ":
            count += 1
            if count == n + 1:
                return text[:i]
    return text
