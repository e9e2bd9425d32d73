"""The simulator's default tokenizer: ids are a pure function of the text's pieces."""

from __future__ import annotations

import hashlib

from engine_worker.sim.tokenizer import SimTokenizer


def _id(piece: str, vocab: int = 32000) -> int:
    return 1 + int.from_bytes(hashlib.blake2b(piece.encode(), digest_size=8).digest(),
                              "big") % (vocab - 1)


def test_pieces_are_words_punctuation_and_four_character_splits() -> None:
    ids = SimTokenizer().encode("Hello, wonderful world!")
    assert ids == [_id(p) for p in ("Hello", ",", " won", "derf", "ul", " world", "!")]
    assert SimTokenizer().encode("") == []


def test_remembered_ids_equal_fresh_ones_and_the_memory_stays_bounded() -> None:
    text = " ".join(f"w{i} Z{i % 7}." for i in range(300))
    fresh = SimTokenizer(cache_size=1 << 20)
    small = SimTokenizer(cache_size=5)
    first = fresh.encode(text)
    assert fresh.encode(text) == first  # now from memory
    assert small.encode(text) == first and small.encode(text) == first
    assert small.piece_id.cache_info().currsize <= 5
    assert first[:3] == [_id("w0"), _id(" Z0"), _id(".")]
