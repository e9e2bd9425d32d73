"""bench.spread: the acceptance ratios' intervals, from requests paired by index."""

from __future__ import annotations

import random

from bench.spread import per_request, pooled_interval, ratio_interval


def _result(ttfts: dict[int, float | None], engine: dict[int, float] | None = None) -> dict:
    records = [{"index": i, "status": "ok" if t is not None else "error", "sent_s": 1.0,
                "first_token_s": None if t is None else 1.0 + t / 1000,
                "engine_ttft_ms": (engine or {}).get(i)} for i, t in ttfts.items()]
    return {"meta": {"time_scale": 1.0}, "records": records}


def test_client_and_engine_times_are_read_per_request_and_failures_left_out() -> None:
    result = _result({0: 120.0, 1: None, 2: 80.0}, engine={0: 100.0, 2: 70.0})
    client = per_request(result, engine=False)
    assert client.keys() == {0, 2} and abs(client[0] - 120.0) < 1e-6
    assert per_request(result, engine=True) == {0: 100.0, 2: 70.0}


def test_a_policy_slower_on_every_request_has_an_interval_that_excludes_one() -> None:
    rng = random.Random(1)
    base = {i: rng.lognormvariate(5, 0.6) for i in range(1200)}
    slower = {i: v * 1.10 for i, v in base.items()}
    low, high = ratio_interval(slower, base, 0.9)
    assert 1.0 < low <= 1.10 <= high < 1.2


def test_two_policies_differing_only_by_noise_get_an_interval_that_holds_one() -> None:
    rng = random.Random(2)
    a = {i: rng.lognormvariate(5, 0.6) for i in range(1200)}
    b = {i: rng.lognormvariate(5, 0.6) for i in range(1200)}
    low, high = ratio_interval(a, b, 0.99)
    assert low < 1.0 < high


def test_only_requests_both_policies_served_are_paired() -> None:
    mine = {0: 100.0, 1: 100.0, 2: 100.0}
    other = {1: 50.0, 2: 50.0, 3: 1.0}  # 3 is not paired: it would pull the ratio to 100
    assert ratio_interval(mine, other, 0.5) == (2.0, 2.0)


def test_pooled_runs_narrow_the_interval_and_keep_the_ratio() -> None:
    rng = random.Random(3)
    runs = []
    for _ in range(4):  # each request's time under either policy: its own draw
        runs.append(({i: 1.03 * rng.lognormvariate(5, 0.6) for i in range(1200)},
                     {i: rng.lognormvariate(5, 0.6) for i in range(1200)}))
    ratio, low, high = pooled_interval(runs, 0.5)
    assert low <= ratio <= high and low < 1.03 < high
    one_low, one_high = ratio_interval(*runs[0], 0.5)
    assert high - low < one_high - one_low  # four runs' requests pin it down further


def test_pooling_resamples_each_run_within_itself() -> None:
    # run 1: mine 2x the other's; run 2: equal. Pooled, the median sits between, and no draw
    # can mix run 1's "mine" with run 2's "other"
    run1 = ({i: 200.0 for i in range(100)}, {i: 100.0 for i in range(100)})
    run2 = ({i: 100.0 for i in range(100)}, {i: 100.0 for i in range(100)})
    ratio, low, high = pooled_interval([run1, run2], 0.5)
    assert ratio == low == high == 1.5
