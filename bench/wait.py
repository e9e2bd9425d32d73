"""``python -m bench.wait NAME [POLICY ...]``: each request's engine TTFT split into its
floor and its wait.

The floor is what the request's own uncached prompt costs an idle engine (the simulator's
roofline, in its prefill chunks, after the cached tokens the engine reported); the wait
is the rest: the queue ahead and the decodes sharing its steps. Two policies can reach the
same TTFT one way or the other (more hits and longer queues, or fewer hits and shorter
ones); this shows which, and for the first policy, which of its decisions waited.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from bench.analysis import percentile
from bench.spread import load
from engine_worker.sim.engine_config import EngineConfig
from engine_worker.sim.profiles import Profile, load_profile
from engine_worker.sim.roofline import StepCost, step_seconds


def floor_ms(profile: Profile, prompt_tokens: int, cached_tokens: int,
             chunk: int = EngineConfig().max_num_batched_tokens) -> float:
    """An idle engine's TTFT for this prompt with ``cached_tokens`` already cached."""
    seconds, done = 0.0, cached_tokens
    while done < prompt_tokens:
        n = min(chunk, prompt_tokens - done)
        cost = StepCost()
        cost.add_tokens(profile, n, done)
        seconds += step_seconds(profile, cost)
        done += n
    return seconds * 1000


def split(records: Sequence[dict[str, Any]], profile: Profile
          ) -> list[tuple[str, float, float]]:
    """(reason, floor ms, wait ms) of every served request with an engine TTFT."""
    out = []
    for r in records:
        if r["status"] == "ok" and r.get("engine_ttft_ms") is not None:
            floor = floor_ms(profile, r["prompt_tokens"], r["cached_tokens"])
            out.append((r["reason"], floor, r["engine_ttft_ms"] - floor))
    return out


def _line(label: str, rows: Sequence[tuple[str, float, float]]) -> str:
    floors, waits = [f for _, f, _ in rows], [w for _, _, w in rows]
    return (f"| {label} | {len(rows)} | " + " / ".join(f"{percentile(floors, q):.0f}" for q in
                                                       (0.5, 0.9, 0.99))
            + " | " + " / ".join(f"{percentile(waits, q):.1f}" for q in (0.5, 0.9, 0.99))
            + f" | {sum(floors) / 1000:.1f} | {sum(waits) / 1000:.1f} |")


def report(name: str, policies: Sequence[str]) -> str:
    runs = load(name)
    if not runs:
        raise SystemExit(f"no {name}-*.json in bench/results")
    policies = [p for p in policies if p in runs] or list(runs)
    head = ("| {} | requests | floor p50 / p90 / p99 (ms) | wait p50 / p90 / p99 (ms) "
            "| floors (s) | waited (s) |\n|---|---|---|---|---|---|")
    lines = [f"`python -m bench.wait {name} {' '.join(policies)}`", "", head.format("policy")]
    first = None
    for policy in policies:
        profile = load_profile(runs[policy]["meta"]["profile"])
        rows = split(runs[policy]["records"], profile)
        first = first or (policy, rows)
        lines.append(_line(policy, rows))
    policy, rows = first
    lines += ["", f"{policy}, by decision:", "", head.format("reason")]
    reasons = sorted({r for r, _, _ in rows}, key=lambda r: -sum(x[0] == r for x in rows))
    lines += [_line(reason, [x for x in rows if x[0] == reason]) for reason in reasons]
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit(__doc__)
    print(report(argv[0], argv[1:]))


if __name__ == "__main__":
    main(sys.argv[1:])
