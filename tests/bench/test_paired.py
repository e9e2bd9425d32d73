"""bench.paired: a request's first token under two paths, paired by its index."""

from __future__ import annotations

import math

from bench.paired import crossings, outside, paired


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


def test_crossings_count_requests_on_either_side_of_the_others_median() -> None:
    def placed(index: int, ttft_s: float, cached: int, reason: str = "warm") -> dict:
        return {**record(index, ttft_s, cached), "reason": reason}
    # other's times 0.1 .. 0.5 s: median 0.3 s
    other = [placed(i, 0.1 * (i + 1), cached=1000) for i in range(5)]
    base = [placed(0, 0.35, 1000),               # above, other below: same cache (queued)
            placed(1, 0.40, 1000),               # above, other below (0.2): same cache
            placed(2, 0.30, 1000),               # other's median itself: crosses nothing
            placed(3, 0.10, 4000, reason="ring"),  # below, other above: found more cached
            placed(4, 0.60, 0)]                  # above both ways: crosses nothing
    median, above, below = crossings(base, other)
    assert round(median, 6) == 300.0
    assert above == {("warm", "same cached"): 2}
    assert below == {("ring", "more cached"): 1}


def test_outside_pairs_the_time_around_the_engines_server() -> None:
    """Placement moves the server's time; what is left is the router's hop."""
    def served(index: int, ttft_s: float, server_ms: float | None) -> dict:
        return {**record(index, ttft_s), "server_ttft_ms": server_ms}
    base = [served(0, 0.105, 100.0), served(1, 0.306, 300.0), served(2, 0.050, 44.0),
            served(3, 0.2, None)]  # no server time: not paired
    # request 1 went elsewhere and took 200 ms more in the engine, 1 ms more outside
    other = [served(0, 0.107, 100.0), served(1, 0.507, 500.0), served(2, 0.051, 44.0),
             served(3, 0.9, 100.0)]
    assert round(outside(base, other), 6) == 1.0  # median of +2, +1, +1 ms
    assert math.isnan(outside(base, [served(3, 0.3, None)]))
