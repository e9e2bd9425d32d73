"""``python -m bench.floor NAME``: how far each policy's first tokens are from the least any
placement could give, request by request.

The hit-rate bounds (bench/bounds.py) say how much of the cache a policy used; this says
what that and its queues cost in time. A request's *floor* is its TTFT alone on an idle
engine that holds every earlier prompt of the workload: no worker can start it sooner or
find more of it cached. The floor is the simulator's own (same profile, 8,192-token prefill
steps), so it holds for the simulated fleets the comparisons run, not for real vLLM.

Why per request: on the Mooncake replay 91-95 % of the requests under predicted_ttft and
llm-d's reproduction reach the engine within 10 ms of their floor, and a median is then
set by the score or so whose floor lies below it but which queued or missed above it
(``pushed``): close counts of those leave two policies' medians close however their
tails differ.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from bench.analysis import percentile
from bench.offline import model_len
from bench.spread import load, per_request
from bench.workloads import BenchRequest, make_workload
from engine_worker.sim.engine import Engine
from engine_worker.sim.engine_config import EngineConfig
from engine_worker.sim.profiles import load_profile
from engine_worker.sim.tokenizer import SimTokenizer

NEAR_MS = 10.0  # within this of its floor, a request met it (a step's overhead, a hop)
IDLE_GAP_S = 3600.0  # between two requests: each finds the engine idle


def ttft_floor_ms(requests: Sequence[BenchRequest], profile: str) -> dict[int, float]:
    """Request index -> its floor: run alone, in order, on one engine whose cache never
    evicts (as large as every prompt together)."""
    blocks = sum(r.prompt_tokens + r.max_tokens for r in requests) // 16 + 1024
    engine = Engine(profile, EngineConfig(num_gpu_blocks=blocks,
                                          max_model_len=model_len(requests), hash_seed="0"))
    tokenizer = SimTokenizer(load_profile(profile).model.vocab)
    floors: dict[int, float] = {}
    now = 0.0
    for request in requests:
        now = max(now, engine.sim_now) + IDLE_GAP_S
        engine.sim_now = now
        handle = engine.add_request(tokenizer.encode(request.prompt), 1, arrival=now)
        while not handle.done:
            if engine.step() is None:
                raise RuntimeError(f"request {request.index} never fits the engine")
        assert handle.stats.first_token is not None
        floors[request.index] = (handle.stats.first_token - now) * 1000.0
    return floors


def excess(engine_ttft: dict[int, float], floor: dict[int, float]) -> dict[str, float]:
    """Percentiles of the engines' TTFT over the floor, and the share of requests that met
    it. The engine's clock leaves out what a router holds back before sending."""
    over = [t - floor[i] for i, t in engine_ttft.items()]
    return {"p50": percentile(over, 0.5), "p90": percentile(over, 0.9),
            "near": sum(e <= NEAR_MS for e in over) / len(over)}


def pushed(client_ttft: dict[int, float], floor: dict[int, float]) -> int:
    """Requests whose floor is over ``NEAR_MS`` below the policy's median first token and
    whose own first token came after it: what lifts a median off the floor's (the margin
    keeps out those a hop carries across)."""
    median = percentile(list(client_ttft.values()), 0.5)
    return sum(1 for i, t in client_ttft.items() if floor[i] + NEAR_MS < median < t)


def report(name: str) -> str:
    results = load(name)
    if not results:
        raise SystemExit(f"no results named {name} in bench/results")
    meta = next(iter(results.values()))["meta"]
    requests = make_workload(meta["workload"], **meta["workload_opts"])
    floor = ttft_floor_ms(requests, meta["profile"])
    f = list(floor.values())
    lines = [f"{name}: TTFT floor (alone on an idle engine holding every earlier prompt) "
             f"p50 / p90 / p99 {percentile(f, 0.5):,.0f} / {percentile(f, 0.9):,.0f} / "
             f"{percentile(f, 0.99):,.0f} ms, {len(f)} requests", "",
             "| policy | TTFT p50 / p90 / p99 (ms) | pushed across its median | engine TTFT "
             f"over the floor p50 / p90 (ms) | engine TTFT within {NEAR_MS:.0f} ms of it |",
             "|---|---|---|---|---|"]
    for policy, result in sorted(results.items()):
        client, engine = per_request(result, engine=False), per_request(result, engine=True)
        if not client:
            continue
        c = list(client.values())
        row = (f"| {policy} | {percentile(c, 0.5):,.0f} / {percentile(c, 0.9):,.0f} / "
               f"{percentile(c, 0.99):,.0f} | {pushed(client, floor)} |")
        if engine:
            e = excess(engine, floor)
            row += f" {e['p50']:,.1f} / {e['p90']:,.0f} | {e['near']:.0%} |"
        else:
            row += " – | – |"
        lines.append(row)
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        raise SystemExit("usage: python -m bench.floor NAME")
    print(report(argv[0]))


if __name__ == "__main__":
    main(sys.argv[1:])
