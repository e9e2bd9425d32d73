"""bench/offline.py: the router's pipeline in front of simulated engines on simulated time."""

from __future__ import annotations

import asyncio
import random

from bench.offline import (
    BURST_GAP_S,
    ORACLE,
    RELEASE_S,
    InFlight,
    ratio_lines,
    repeated,
    replay,
    router_config,
    run,
    spaced,
)
from bench.runner import RunConfig
from bench.workloads import BenchRequest


def config(policy: str, **extra: object) -> RunConfig:
    return RunConfig(workload="rag", workload_opts={"count": 150, "docs": 20, "seed": 3,
                                                    "send_context_hash": False},
                     policy=policy, workers=4, cache_fleet_ratio=1.5, **extra)


def test_a_replay_is_deterministic_and_answers_every_request() -> None:
    first, again = run(config("predicted_ttft")), run(config("predicted_ttft"))
    # the decisions' CPU is this machine's; everything else is simulated time
    assert first.pop("decide_cpu_us_p50") > 0 and again.pop("decide_cpu_us_p50") > 0
    assert first == again  # nothing of the machine leaks in
    assert first["requests"] == 150
    assert first["predicted_ttft_error_median"] is not None


def test_residency_routing_beats_round_robin_on_hits_and_ttft() -> None:
    """The router learns from the engines as it does live: residency at the first token."""
    aware, blind = run(config("predicted_ttft")), run(config("round_robin"))
    assert aware["hit_rate"] > blind["hit_rate"] + 0.1
    assert aware["ttft_ms"]["p50"] < blind["ttft_ms"]["p50"]
    assert set(aware["reasons"]) - {"ring", "cold", "warm", "home", "replicate", "spill",
                                     "spread"} == set()


def test_router_flags_reach_the_decision() -> None:
    plain = run(config("predicted_ttft", router_extra=["--attention-tokens", "0",
                                                       "--queue-drain", "false"]))
    default = run(config("predicted_ttft"))
    plain.pop("decide_cpu_us_p50"), default.pop("decide_cpu_us_p50")  # differs run to run
    assert plain != default


def test_ratio_lines_compare_the_first_policy_with_the_best_other_per_seed() -> None:
    def row(policy: str, seed: int, p50: float, p90: float, p99: float):
        return policy, seed, {"ttft_ms": {"p50": p50, "p90": p90, "p99": p99}}

    rows = [row("mine", 0, 100, 200, 400), row("a", 0, 125, 180, 500),
            row("b", 0, 110, 250, 800), row("mine", 1, 90, 200, 450), row("a", 1, 100, 160, 500),
            row("b", 1, 120, 400, 300)]
    text = ratio_lines("mine", rows)
    assert "- seed 0: p50 0.91, p90 1.11, p99 0.80" in text  # best others: b, a, a
    assert "- seed 1: p50 0.90, p90 1.25, p99 1.50" in text  # a, a, b
    assert "p50 0.905, p90 1.179, p99 1.095" in text  # sqrt(0.909 x 0.9), ...


def test_a_request_arriving_during_a_step_counts_its_wait_for_that_step() -> None:
    """A busy engine has already run its clock to the end of the step in progress when a
    request arrives mid-step: its TTFT runs from its arrival, not from that step's end."""
    import asyncio

    from bench.offline import replay, router_config
    from bench.workloads import BenchRequest

    long_prompt = " ".join(f"doc{i}" for i in range(3000))  # ~6,000 tokens: one step
    requests = [BenchRequest(0, 0.0, long_prompt, 8000, 4),  # tokens: an upper bound,
                BenchRequest(1, 0.02, "a short question", 16, 4)]  # sizes max_model_len
    fleet = asyncio.run(replay(requests, router_config("round_robin", []), 1,
                               "llama-3-8b@h100-80gb", 20_000))
    first, second = (next(f.handle.stats for f in fleet.done if f.request is r)
                     for r in requests)
    assert first.ttft > 0.1  # one long prefill step, which the second arrives during
    assert second.arrival == 0.02
    assert second.first_token > first.first_token  # it waited for that step
    assert second.ttft > first.ttft - 0.02


def test_a_held_follower_reaches_the_engine_after_the_prompt_ahead_has_its_first_token() -> None:
    """The replay models the router's prefill gate: a follower whose first tokens would fill
    the last step of the prompt ahead waits for that prompt's first token, and the prompt
    ahead is not delayed by it as it is with the gate off."""
    ahead = " ".join(f"doc{i}" for i in range(6000))  # ~12,000 tokens: two steps
    follower = " ".join(f"q{i}" for i in range(3000))  # ~6,000, arriving in the first
    requests = [BenchRequest(0, 0.0, ahead, 16_000, 4),
                BenchRequest(1, 0.05, follower, 8_000, 4)]

    def flights(gate_ms: str) -> list[InFlight]:
        fleet = asyncio.run(replay(requests, router_config(
            "predicted_ttft", ["--prefill-gate-ms", gate_ms]), 1, "llama-3-8b@h100-80gb",
            20_000))
        return [next(f for f in fleet.done if f.request is r) for r in requests]

    (gated_ahead, held), (sent_ahead, sent) = flights("30"), flights("0")
    assert held.held and not sent.held and not gated_ahead.held
    first_token = gated_ahead.handle.stats.first_token
    assert abs(held.handle.stats.arrival - (first_token + RELEASE_S)) < 1e-9
    assert gated_ahead.ttft_s() < sent_ahead.ttft_s() - 0.1  # its last step is its own
    assert held.ttft_s() > held.handle.stats.ttft  # from the router: the hold counts


def test_a_burst_reaches_the_router_spaced_in_its_order() -> None:
    """Requests due at one instant come ``gap`` apart in their order, as the live load
    generator sends them; a jitter moves each by less than another gap, order kept."""
    due = [0.0, 0.0, 0.0, 3.0, 6.0, 6.0]
    requests = [BenchRequest(i, t, f"q{i}", 2, 4) for i, t in enumerate(due)]
    assert [r.arrival_s for r in spaced(requests, 0.001)] == \
        [0.0, 0.001, 0.002, 3.0, 6.0, 6.001]
    assert spaced(requests, 0.0) == requests
    moved = [r.arrival_s for r in spaced(requests, 0.001, random.Random(7))]
    assert moved == sorted(moved)
    assert all(0.0 <= m - (t + p * 0.001) < 0.001
               for m, t, p in zip(moved, due, [0, 1, 2, 0, 0, 1], strict=True))


def test_a_burst_spaced_does_not_share_the_first_prompts_step() -> None:
    """At one instant two prompts on an idle engine were admitted into one prefill step and
    got their first tokens together; 0.33 ms apart, the first starts alone and the second
    waits for its step, as live."""
    first = " ".join(f"doc{i}" for i in range(1500))  # ~3,000 tokens: under one step
    requests = [BenchRequest(0, 0.0, first, 4000, 4), BenchRequest(1, 0.0, "a question", 16, 4)]

    def stats(gap_s: float):
        fleet = asyncio.run(replay(spaced(requests, gap_s), router_config("round_robin", []),
                                   1, "llama-3-8b@h100-80gb", 20_000))
        return [next(f.handle.stats for f in fleet.done if f.request.index == r.index)
                for r in requests]

    (a, b), (a2, b2) = stats(0.0), stats(BURST_GAP_S)
    assert b.first_token == a.first_token  # one step for both
    assert b2.arrival == BURST_GAP_S and b2.first_token > a2.first_token


def test_repeats_report_each_percentiles_mean_and_spread() -> None:
    cfg = config("predicted_ttft")
    cfg.workload_opts = {**cfg.workload_opts, "count": 60}
    result = repeated(cfg, 3, gap_s=0.05)
    singles = [run(cfg, 0.05, jitter_seed=k)["ttft_ms"]["p50"] for k in range(3)]
    assert result["repeats"] == 3
    assert abs(result["ttft_ms"]["p50"] - sum(singles) / 3) < 1e-9
    assert set(result["ttft_ms_sd"]) == {"p50", "p90", "p99"}
    assert len(set(singles)) > 1  # each repeat moved the arrivals differently
    assert result["ttft_ms_sd"]["p50"] > 0.0


def test_the_greedy_oracle_sends_each_request_where_its_first_token_comes_soonest() -> None:
    """A follow-up goes to the worker that holds its prefix; a short prompt arriving with a
    long one goes to the other, idle worker; an unknown policy name never reaches the
    router (the oracle is the bench's)."""
    doc = " ".join(f"doc{i}" for i in range(2000))  # ~4,000 tokens
    other = " ".join(f"other{i}" for i in range(4000))  # ~12,000
    requests = [BenchRequest(0, 0.0, doc, 5000, 4),
                BenchRequest(1, 5.0, doc + " and a question", 5000, 4),
                BenchRequest(2, 10.0, other, 13_000, 4),
                BenchRequest(3, 10.0001, "a short question", 16, 4)]
    fleet = asyncio.run(replay(requests, router_config("round_robin", []), 2,
                               "llama-3-8b@h100-80gb", 20_000, oracle=True))
    placed = {f.request.index: f.worker.id for f in fleet.done}
    assert placed[1] == placed[0]  # warm
    assert placed[3] != placed[2]  # not behind the long prefill
    assert {f.reason for f in fleet.done} == {ORACLE}
    blind = asyncio.run(replay(requests, router_config("round_robin", []), 2,
                               "llama-3-8b@h100-80gb", 20_000))
    assert {f.request.index: f.worker.id for f in blind.done} != placed
