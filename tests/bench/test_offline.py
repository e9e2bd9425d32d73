"""bench/offline.py: the router's pipeline in front of simulated engines on simulated time."""

from __future__ import annotations

from bench.offline import run
from bench.runner import RunConfig


def config(policy: str, **extra: object) -> RunConfig:
    return RunConfig(workload="rag", workload_opts={"count": 150, "docs": 20, "seed": 3,
                                                    "send_context_hash": False},
                     policy=policy, workers=4, cache_fleet_ratio=1.5, **extra)


def test_a_replay_is_deterministic_and_answers_every_request() -> None:
    first, again = run(config("predicted_ttft")), run(config("predicted_ttft"))
    assert first == again  # simulated time: nothing of the machine leaks in
    assert first["requests"] == 150
    assert first["predicted_ttft_error_median"] is not None


def test_residency_routing_beats_round_robin_on_hits_and_ttft() -> None:
    """The router learns from the engines as it does live: residency at the first token."""
    aware, blind = run(config("predicted_ttft")), run(config("round_robin"))
    assert aware["hit_rate"] > blind["hit_rate"] + 0.1
    assert aware["ttft_ms"]["p50"] < blind["ttft_ms"]["p50"]
    assert set(aware["reasons"]) - {"ring", "cold", "warm", "home", "replicate", "spill"} == set()


def test_router_flags_reach_the_decision() -> None:
    priced = run(config("predicted_ttft", router_extra=["--attention-tokens", "32768",
                                                        "--queue-drain", "true"]))
    assert priced != run(config("predicted_ttft"))
