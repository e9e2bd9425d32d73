"""bench.paired: a request's first token under two paths, paired by its index."""

from __future__ import annotations

from bench.paired import paired


def record(index: int, ttft_s: float, cached: int = 0, status: str = "ok") -> dict:
    return {"index": index, "sent_s": 10.0 + index, "first_token_s": 10.0 + index + ttft_s,
            "cached_tokens": cached, "status": status}


def test_pairs_by_index_and_skips_failures() -> None:
    base = [record(0, 0.100), record(1, 0.200, cached=64), record(2, 0.300),
            record(3, 0.100, status="error")]
    # served in another order; request 1 found another cache; request 3 failed in base
    other = [record(2, 0.304), record(0, 0.102), record(1, 0.900, cached=0), record(3, 0.1)]
    every, same, n = paired(base, other)
    assert n == 3
    assert round(every, 3) == 4.0  # median of +2, +700, +4 ms
    assert round(same, 3) == 3.0  # requests 0 and 2 only: +2 and +4 ms
