"""``python -m bench.floor NAME [NAME ...]``: how far each policy's first tokens are from
the least any placement could give, request by request.

The hit-rate bounds (bench/bounds.py) say how much of the cache a policy used; this says
what that and its queues cost in time. A request's *floor* is its TTFT alone on an idle
engine that holds every earlier prompt of the workload: no worker can start it sooner or
find more of it cached. The floor is the simulator's own (same profile, 8,192-token prefill
steps), so it holds for the simulated fleets the comparisons run, not for real vLLM.

Why per request: on the Mooncake replay 91-95 % of the requests under predicted_ttft and
llm-d's reproduction reach the engine within 10 ms of their floor, and a median is then
set by the score or so whose floor lies below it but which queued or missed above it
(``pushed``): close counts of those leave two policies' medians close however their
tails differ. Given several runs of one comparison, it also names the requests a policy
pushes in most of them (a placement's habit, not a run's timing), and how often a policy
sent a request to a worker that was decoding another (its first tokens wait out a decode
step there).
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Sequence
from typing import Any

import orjson

from bench.analysis import percentile
from bench.offline import model_len
from bench.spread import load, per_request
from bench.workloads import BenchRequest, make_workload
from engine_worker.sim.engine import Engine
from engine_worker.sim.engine_config import EngineConfig
from engine_worker.sim.profiles import load_profile
from engine_worker.sim.tokenizer import SimTokenizer

NEAR_MS = 10.0  # within this of its floor, a request met it (a step's overhead, a hop)
MISSED_MS = 30.0  # over its floor by this on the engine: it computed what the floor had cached
CAUSES = ("tick", "queued", "missed", "near")  # why_pushed's, in the tables' order
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


def pushed_requests(client_ttft: dict[int, float], floor: dict[int, float]) -> set[int]:
    """Requests whose floor is over ``NEAR_MS`` below the policy's median first token and
    whose own first token came after it: what lifts a median off the floor's (the margin
    keeps out those a hop carries across)."""
    median = percentile(list(client_ttft.values()), 0.5)
    return {i for i, t in client_ttft.items() if floor[i] + NEAR_MS < median < t}


def _by_worker(records: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Served requests (a first token) whose record names their worker, per worker (a
    peer's router does not say)."""
    by_worker: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        if r["status"] == "ok" and r.get("first_token_s") is not None \
                and r.get("worker") is not None:
            by_worker.setdefault(r["worker"], []).append(r)
    return by_worker


def sent_mid_decode(records: Sequence[dict[str, Any]]) -> dict[int, bool]:
    """Request index -> whether its worker was streaming another request's tokens (past
    that one's first token, before its end) when it was sent. Served requests whose worker
    the record names (a peer's router does not say)."""
    return {r["index"]: any(o is not r and o["first_token_s"] <= r["sent_s"] < o["end_s"]
                            for o in served)
            for served in _by_worker(records).values() for r in served}


def why_pushed(result: dict[str, Any], pushed_ones: set[int], floor: dict[int, float]
               ) -> Counter[str] | None:
    """Why each pushed request crossed the median, from the records: ``tick`` it queued
    behind a prompt sent to its worker under ``NEAR_MS`` before it (arrivals of one instant,
    decided one after the other); ``queued`` behind older work there; ``missed`` its engine
    TTFT is ``MISSED_MS`` over its floor with nothing ahead (it computed a prefix another
    worker held); ``near`` its engine came within ``MISSED_MS`` of the floor, and the hop,
    the server or a decode step carried it across. None where the records name no worker
    or no engine TTFT (a peer's router)."""
    by_worker = _by_worker(result["records"])
    records = {r["index"]: r for served in by_worker.values() for r in served}
    if any(i not in records or records[i].get("engine_ttft_ms") is None for i in pushed_ones):
        return None
    scale = 1000.0 / result["meta"].get("time_scale", 1.0)
    causes: Counter[str] = Counter()
    for i in pushed_ones:
        r = records[i]
        ahead = [o for o in by_worker[r["worker"]]
                 if o is not r and o["sent_s"] <= r["sent_s"] < o["first_token_s"]]
        if any((r["sent_s"] - o["sent_s"]) * scale < NEAR_MS for o in ahead):
            causes["tick"] += 1
        elif ahead:
            causes["queued"] += 1
        elif r["engine_ttft_ms"] - floor[i] >= MISSED_MS:
            causes["missed"] += 1
        else:
            causes["near"] += 1
    return causes


def report(name: str, results: dict[str, dict[str, Any]], floor: dict[int, float]) -> str:
    f = list(floor.values())
    lines = [f"{name}: TTFT floor (alone on an idle engine holding every earlier prompt) "
             f"p50 / p90 / p99 {percentile(f, 0.5):,.0f} / {percentile(f, 0.9):,.0f} / "
             f"{percentile(f, 0.99):,.0f} ms, {len(f)} requests", "",
             "| policy | TTFT p50 / p90 / p99 (ms) | pushed across its median | engine TTFT "
             f"over the floor p50 / p90 (ms) | engine TTFT within {NEAR_MS:.0f} ms of it | "
             "sent mid-decode | engine over the floor p50, sent to an idle / a decoding "
             "worker (ms) | pushed: behind a prompt of the same instant / behind older work "
             "/ missed the cache / met the floor on the engine | client over engine TTFT "
             "p50 / p90 (ms) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for policy, result in sorted(results.items()):
        client, engine = per_request(result, engine=False), per_request(result, engine=True)
        if not client:
            continue
        c = list(client.values())
        crossed = pushed_requests(client, floor)
        row = (f"| {policy} | {percentile(c, 0.5):,.0f} / {percentile(c, 0.9):,.0f} / "
               f"{percentile(c, 0.99):,.0f} | {len(crossed)} |")
        if engine:
            e = excess(engine, floor)
            row += f" {e['p50']:,.1f} / {e['p90']:,.0f} | {e['near']:.0%} |"
        else:
            row += " – | – |"
        decoding = sent_mid_decode(result["records"])
        split = [[t - floor[i] for i, t in engine.items() if decoding.get(i) is busy]
                 for busy in (False, True)]
        row += f" {sum(decoding.values()) / len(decoding):.0%} | " if decoding else " – | "
        row += " / ".join(f"{percentile(s, 0.5):,.1f}" if s else "–" for s in split) + " |"
        causes = why_pushed(result, crossed, floor)
        row += (" " + " / ".join(str(causes[k]) for k in CAUSES) + " |") if causes is not None \
            else " – |"
        unseen = [client[i] - t for i, t in engine.items() if i in client]  # by the engine
        row += f" {percentile(unseen, 0.5):,.1f} / {percentile(unseen, 0.9):,.1f} |" \
            if unseen else " – |"
        lines.append(row)
    return "\n".join(lines)


def habits(names: Sequence[str], runs: Sequence[dict[str, dict[str, Any]]],
           floor: dict[int, float]) -> str:
    """Per policy, why its pushed requests crossed (``why_pushed``, a run) and those it
    pushed in more than half of the runs ``names`` that it took part in, all of one
    workload (one floor, the same request indices)."""
    counts: dict[str, Counter[int]] = {}
    why: dict[str, Counter[str] | None] = {}  # None: some run's records cannot say
    taken: Counter[str] = Counter()  # runs each policy took part in
    for results in runs:
        for policy, result in results.items():
            client = per_request(result, engine=False)
            if client:
                crossed = pushed_requests(client, floor)
                counts.setdefault(policy, Counter()).update(crossed)
                causes = why_pushed(result, crossed, floor)
                known = why.get(policy, Counter())
                why[policy] = None if causes is None or known is None else known + causes
                taken[policy] += 1
    lines = [f"Requests pushed across the median in more than half of the runs "
             f"({', '.join(names)}) each policy took part in:", "",
             "| policy | runs | pushed per run | of which a run: behind a prompt of the same "
             "instant / behind older work / missed the cache / met the floor on the engine | "
             "in more than half of the runs | those requests |",
             "|---|---|---|---|---|---|"]
    for policy, count in sorted(counts.items()):
        n = taken[policy]
        habit = sorted(i for i, k in count.items() if 2 * k > n)
        causes = why[policy]
        split = " / ".join(f"{causes[k] / n:.1f}" for k in CAUSES) if causes is not None \
            else "–"
        lines.append(f"| {policy} | {n} | {sum(count.values()) / n:.1f} | {split} | "
                     f"{len(habit)} | {', '.join(map(str, habit)) or '–'} |")
    return "\n".join(lines)


def workload_key(results: dict[str, dict[str, Any]]) -> bytes:
    """What one floor serves: the runs' workload, its options and the profile."""
    meta = next(iter(results.values()))["meta"]
    return orjson.dumps([meta["workload"], meta["workload_opts"], meta["profile"]],
                        option=orjson.OPT_SORT_KEYS)


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit("usage: python -m bench.floor NAME [NAME ...]")
    runs = [load(name) for name in argv]
    for name, results in zip(argv, runs, strict=True):
        if not results:
            raise SystemExit(f"no results named {name} in bench/results")
    floors: dict[bytes, dict[int, float]] = {}
    for results in runs:
        key = workload_key(results)
        if key not in floors:
            meta = next(iter(results.values()))["meta"]
            floors[key] = ttft_floor_ms(make_workload(meta["workload"], **meta["workload_opts"]),
                                        meta["profile"])
    print("\n\n".join(report(name, results, floors[workload_key(results)])
                       for name, results in zip(argv, runs, strict=True)))
    if len(argv) > 1:
        if len(floors) > 1:
            raise SystemExit("the runs named are not of one workload: no habits across them")
        print("\n" + habits(argv, runs, next(iter(floors.values()))))


if __name__ == "__main__":
    main(sys.argv[1:])
