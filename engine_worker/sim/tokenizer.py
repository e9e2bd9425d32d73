"""Tokenizers: a cheap deterministic one by default, a Hugging Face one on request.

The default splits text into words (with their leading whitespace) and single punctuation
characters, and maps each piece to ``1 + blake2b(piece) mod (vocab - 1)``. Equal text
prefixes therefore give equal token prefixes, which is all prefix caching needs. A word
longer than 6 characters is split into 4-character pieces so English text comes to roughly
4 characters per token, like BPE tokenizers of Llama-3 class models.
"""

from __future__ import annotations

import functools
import hashlib
import re
from typing import Protocol

_PIECE = re.compile(r"\s*[A-Za-z0-9\u00c0-\uffff]+|\s*[^\sA-Za-z0-9\u00c0-\uffff]|\s+$")


class Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...


class SimTokenizer:
    """Deterministic, dependency-free tokenizer (~4 characters/token on English)."""

    def __init__(self, vocab_size: int = 32000, max_piece: int = 6,
                 cache_size: int = 1 << 20) -> None:
        self.vocab_size = vocab_size
        self.max_piece = max_piece
        # piece -> id, the latest ``cache_size`` distinct pieces (~100 MB at most): a
        # prompt's words repeat across requests, and hashing each anew cost ~18 ms per
        # 6.6 k-token RAG prompt, paid before the engine saw it (a Rust BPE tokenizer
        # takes a few)
        self.piece_id = functools.lru_cache(maxsize=cache_size)(self._hash)

    def _hash(self, piece: str) -> int:
        digest = hashlib.blake2b(piece.encode(), digest_size=8).digest()
        return 1 + int.from_bytes(digest, "big") % (self.vocab_size - 1)

    def encode(self, text: str) -> list[int]:
        piece_id, longest = self.piece_id, self.max_piece
        ids = []
        for piece in _PIECE.findall(text):
            if len(piece) <= longest:
                ids.append(piece_id(piece))
            else:
                ids.extend(piece_id(piece[i:i + 4]) for i in range(0, len(piece), 4))
        return ids


class HFTokenizer:
    """A real tokenizer from a local directory; transformers is imported only when used."""

    def __init__(self, path: str) -> None:
        try:
            from transformers import AutoTokenizer
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise SystemExit("--tokenizer needs the 'transformers' package") from exc
        self._tok = AutoTokenizer.from_pretrained(path)
        self.vocab_size = int(self._tok.vocab_size)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))


def load_tokenizer(path: str | None, vocab_size: int) -> SimTokenizer | HFTokenizer:
    return HFTokenizer(path) if path else SimTokenizer(vocab_size)
