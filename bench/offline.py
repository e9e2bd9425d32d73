"""The fleet on simulated time: the router's own decision in front of simulated engines,
with no processes, sockets or sleeping.

Why: the live bench (bench/runner.py) runs in real time on two shared cores, where a
policy's TTFT moves 10-30 % between runs with whatever else the machine does, and a
Mooncake comparison takes 20 minutes. Here every engine (engine_worker/sim) steps on its
own simulated clock, and at each arrival the router's pipeline (router/server/decide.py,
the code both edges run) decides on what the engines have done until then. A run is
deterministic and takes seconds: what tuning a policy needs.

What it leaves out, so the live bench stays the acceptance measure: the HTTP hop and the
router's CPU time (each decision's CPU is timed and reported, not added to its TTFT), the
delay of scraped gauges (KV usage is read at each decision), and the peers that run as
their own processes (sglang-router, Dynamo). The router learns as
it does live: residency at a request's first token, the prefill line from its time to
first token (simulated) against the work it had to do, the cache feedback from usage.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import heapq
import itertools
import random
import statistics
import time
from collections import deque
from collections.abc import Sequence
from copy import deepcopy
from dataclasses import dataclass, field
from typing import Any

import orjson

from bench import bounds
from bench.analysis import percentile
from bench.fleet import residency_capacity
from bench.runner import RunConfig, plan_blocks
from bench.workloads import BenchRequest, make_workload
from engine_worker.sim.engine import Engine
from engine_worker.sim.engine_config import EngineConfig
from engine_worker.sim.profiles import load_profile
from engine_worker.sim.request import RequestHandle
from engine_worker.sim.tokenizer import SimTokenizer
from router.config import RouterConfig, add_arguments, load_config
from router.fleet.prefill_model import PrefillModel
from router.fleet.worker_cost import WorkerCost
from router.fleet.workers import Worker, WorkerPool
from router.infra.metrics import RouterMetrics
from router.residency.base import ChainShape
from router.residency.memory import MemoryResidency
from router.routing import keys
from router.routing.accounting import Attempt
from router.routing.candidate import Candidate
from router.routing.pipeline import Pipeline
from router.routing.policies import PolicyKnobs, make_policy
from router.routing.usage import Usage
from router.server.decide import decide

MODEL = "sim-model"
PATH = "/v1/completions"


class SimTime:
    """The router's clock here: the arrival being decided."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# what a held stream (router/fleet/prefill_gate.py) loses live between the first byte it
# waited for and its own arrival at the engine: the byte's way back, the dispatch, the
# engine's parse (live RAG: 4.5 ms server time at p50, 2 ms hop)
RELEASE_S = 0.01

# how far apart the live load generator sends the requests of one burst, in their order
# (live Mooncake s33: 0.33 ms at p50 between requests due at the same instant of the trace)
BURST_GAP_S = 0.00033
PERCENTILES = ("p50", "p90", "p99")
# a bench-only policy name: each request to the worker that gives it its first token
# soonest, found by simulating every engine forward (``Fleet._soonest``; minutes a run)
ORACLE = "greedy_oracle"


@dataclass(eq=False)
class InFlight:
    request: BenchRequest
    worker: Worker
    attempt: Attempt
    handle: RequestHandle | None  # None while the router holds it
    reason: str
    predicted_ttft_s: float
    first_seen: bool = False
    held: bool = False  # by the router's prefill gate
    ahead: list[InFlight] = field(default_factory=list)  # a held one's: sent before it,
    # not yet at its first token on the engine (empty: the router has yet to hear it)
    tokens: list[int] = field(default_factory=list)  # a held one's prompt, for its release

    def prefilled(self) -> bool:
        return self.first_seen or (self.handle is not None and self.handle.done)

    def ttft_s(self) -> float | None:
        """From its arrival at the router: a held one's counts the hold."""
        first = None if self.handle is None else self.handle.stats.first_token
        return None if first is None else first - self.request.arrival_s


@dataclass(order=True)
class _Event:
    at: float
    seq: int
    kind: str = field(compare=False)  # "first" | "end"
    flight: InFlight = field(compare=False)


@dataclass
class Fleet:
    engines: list[Engine]
    workers: list[Worker]
    pipeline: Pipeline
    clock: SimTime
    tokenizer: SimTokenizer
    live: list[list[InFlight]] = field(default_factory=list)
    held: list[deque[InFlight]] = field(default_factory=list)  # by the prefill gate
    events: list[_Event] = field(default_factory=list)
    busy_s: list[float] = field(default_factory=list)
    done: list[InFlight] = field(default_factory=list)
    decide_cpu_ns: list[int] = field(default_factory=list)  # this machine's, per decision
    oracle: bool = False  # place by ``_soonest`` instead of the router's decision
    _seq: itertools.count = field(default_factory=itertools.count)

    def advance(self, until: float | None) -> None:
        """Step every engine up to ``until`` (all the way when None), queueing what each
        step's end shows (first tokens, ends) at the time it happened."""
        for i, engine in enumerate(self.engines):
            while (self.live[i] or self.held[i]) and (until is None or engine.sim_now < until):
                self._release(i)
                live = self.live[i]
                if not engine.running and engine.waiting:  # idle until a release arrives
                    engine.sim_now = max(engine.sim_now, engine.waiting[0].req.stats.arrival)
                    if until is not None and engine.sim_now >= until:
                        break
                dt = engine.step()
                if dt is None:
                    raise RuntimeError(f"w{i} cannot schedule anything (a prompt never fits)")
                self.busy_s[i] += dt
                for f in live:
                    assert f.handle is not None
                    stats = f.handle.stats
                    if not f.first_seen and stats.first_token is not None:
                        f.first_seen = True
                        self._push(stats.first_token, "first", f)
                    if f.handle.done:
                        self._push(stats.finished or engine.sim_now, "end", f)
                self.live[i] = [f for f in live if not f.handle.done]

    def _release(self, i: int) -> None:
        """Held streams go once every one sent before them has its first token, each
        ``RELEASE_S`` after the engine's clock shows it."""
        held, engine = self.held[i], self.engines[i]
        while held and all(f.prefilled() for f in held[0].ahead):
            f = held.popleft()
            f.handle = engine.add_request(
                f.tokens, f.request.max_tokens,
                arrival=max(engine.sim_now, f.request.arrival_s) + RELEASE_S)
            self.live[i].append(f)

    def _push(self, at: float, kind: str, flight: InFlight) -> None:
        heapq.heappush(self.events, _Event(at, next(self._seq), kind, flight))

    async def apply(self, until: float | None) -> None:
        """What the router would have heard by ``until``, in the order it happened."""
        while self.events and (until is None or self.events[0].at <= until):
            event = heapq.heappop(self.events)
            self.clock.now = event.at
            f, stats = event.flight, event.flight.handle.stats
            if event.kind == "first":
                f.attempt.first_byte(stats.first_token)
            else:
                f.attempt.usage = Usage(stats.prompt_tokens, stats.cached_tokens)
                f.attempt.end()
                f.worker.finish()
                self.pipeline.complete([f.attempt])
                self.done.append(f)
            await asyncio.sleep(0)  # the residency store applies its batched records

    async def dispatch(self, request: BenchRequest) -> None:
        now = self.clock.now = request.arrival_s
        for w, engine in zip(self.workers, self.engines, strict=True):
            w.cost.kv_usage = engine.kv.usage()  # live: scraped every second
            w.cost.prefill.refresh()  # live: every load tick (router/fleet/load.py)
        body = orjson.dumps({"model": MODEL, "prompt": request.prompt,
                             "max_tokens": request.max_tokens, "stream": True})
        started = time.process_time_ns()
        routed = await decide(self.pipeline, body, PATH, keys.completion_prompt_bytes,
                              request.context_hash)
        self.decide_cpu_ns.append(time.process_time_ns() - started)
        chosen, reason = routed.decision.ranked[0], routed.decision.reason
        tokens = self.tokenizer.encode(request.prompt)
        if self.oracle:
            chosen, reason = self._soonest(routed.decision.ranked, tokens, now), ORACLE
        index = self.workers.index(chosen.worker)
        engine = self.engines[index]
        attempt = self.pipeline.attempt(routed.routing, chosen, stream=True,
                                        may_hold=not self.oracle)
        chosen.worker.begin()
        if attempt.held:
            self.held[index].append(InFlight(
                request, chosen.worker, attempt, None, reason, chosen.ttft_s, held=True,
                ahead=[f for f in self.live[index] if not f.prefilled()] + [*self.held[index]],
                tokens=tokens))
            return
        engine.sim_now = max(engine.sim_now, now)  # an idle engine waits for the arrival
        # its own arrival: a busy engine's clock is already at the end of the step in
        # progress, and its TTFT must count the wait for that step (stamped with that clock,
        # a follower on a busy worker looked up to one 8k-token step, ~300 ms, sooner)
        handle = engine.add_request(tokens, request.max_tokens, arrival=now)
        self.live[index].append(InFlight(request, chosen.worker, attempt, handle, reason,
                                         chosen.ttft_s))

    def _soonest(self, ranked: Sequence[Candidate], tokens: list[int], now: float
                 ) -> Candidate:
        """The greedy clairvoyant's choice: the worker whose engine, copied and stepped on
        with nothing arriving after this request, gives it its first token soonest (at a
        tie, the one with fewer requests). What no router can know; it bounds what placing
        one request at a time could do for each request's own TTFT."""
        def first_token(i: int) -> tuple[float, int]:
            engine = self.engines[i]
            trial = deepcopy(engine, {id(engine.metrics): engine.metrics})  # a lock inside
            trial.sim_now = max(trial.sim_now, now)
            handle = trial.add_request(tokens, 1, arrival=now)
            while handle.stats.first_token is None:
                if trial.step() is None:
                    raise RuntimeError(f"w{i} cannot schedule a prompt it accepted")
            return handle.stats.first_token, len(self.live[i])

        worker = self.workers[min(range(len(self.engines)), key=first_token)]
        return next((c for c in ranked if c.worker is worker), None) or Candidate(worker)


def build_fleet(config: RouterConfig, workers: int, profile: str, blocks: int,
                max_model_len: int) -> Fleet:
    clock = SimTime()
    pool = WorkerPool()
    fleet_line = PrefillModel(seed_rate=config.prefill_rate)
    members = []
    for i in range(workers):
        w = Worker(id=f"w{i}", url=f"sim://w{i}", models=frozenset({MODEL}), healthy=True,
                   capacity_blocks=blocks,  # live: scraped from the engine (state.py)
                   cost=WorkerCost(prefill=fleet_line.child(), drains=config.queue_drain))
        pool.add(w)
        members.append(w)
    residency = MemoryResidency(residency_capacity(blocks, config.block_chars),
                                ChainShape(config.max_blocks, keys.TAIL_FACTOR))
    pipeline = Pipeline(pool, make_policy(config.policy, PolicyKnobs.of(config), clock),
                        residency, RouterMetrics(), block_chars=config.block_chars,
                        max_blocks=config.max_blocks, key_blocks=config.key_blocks,
                        decode_penalty_s=config.decode_penalty_ms / 1000.0,
                        attention_tokens=config.attention_tokens,
                        offload_weight=config.offload_weight,
                        shortlist_size=config.shortlist_size,
                        prefill_gate_s=config.prefill_gate_ms / 1000.0,
                        chunk_tokens=config.prefill_chunk_tokens, clock=clock)
    engines = [Engine(profile, EngineConfig(model_name=MODEL, num_gpu_blocks=blocks,
                                            max_model_len=max_model_len, hash_seed="0"))
               for _ in range(workers)]
    return Fleet(engines, members, pipeline, clock,
                 SimTokenizer(load_profile(profile).model.vocab),
                 live=[[] for _ in range(workers)], held=[deque() for _ in range(workers)],
                 busy_s=[0.0] * workers)


def model_len(requests: Sequence[BenchRequest]) -> int:
    """An engine's ``max_model_len`` that fits the longest request, in whole 1,024s."""
    longest = max(r.prompt_tokens + r.max_tokens for r in requests)
    return -(-(longest + 16) // 1024) * 1024


async def replay(requests: list[BenchRequest], config: RouterConfig, workers: int,
                 profile: str, blocks: int, oracle: bool = False) -> Fleet:
    fleet = build_fleet(config, workers, profile, blocks, model_len(requests))
    fleet.oracle = oracle
    for request in requests:
        fleet.advance(request.arrival_s)
        await fleet.apply(request.arrival_s)
        await fleet.dispatch(request)
    fleet.advance(None)
    await fleet.apply(None)
    return fleet


def spaced(requests: Sequence[BenchRequest], gap_s: float = BURST_GAP_S,
           jitter: random.Random | None = None) -> list[BenchRequest]:
    """The requests as they reach the router live: those due at one instant (the Mooncake
    trace's timestamps are 3 s apart at their finest) ``gap_s`` apart in their order, each
    moved up to a further ``gap_s`` by ``jitter`` when given. Sent at one instant, a burst's
    prompts on one idle engine shared its first prefill step; live the first starts alone
    and the next waits for that step (offline Mooncake seed 0, llm-d's reproduction: p50
    189 ms at one instant, 191 spaced)."""
    out = []
    due, position = None, 0
    for r in requests:
        position = position + 1 if r.arrival_s == due else 0
        due = r.arrival_s
        shift = position * gap_s + (jitter.uniform(0.0, gap_s) if jitter else 0.0)
        out.append(dataclasses.replace(r, arrival_s=r.arrival_s + shift) if shift else r)
    return out


def summary(fleet: Fleet, bound: dict[str, Any]) -> dict[str, Any]:
    ttfts = [(f, t * 1000) for f in fleet.done if (t := f.ttft_s()) is not None]
    ttft = [t for _, t in ttfts]
    queries = sum(e.counters.prefix_queries for e in fleet.engines)
    hits = sum(e.counters.prefix_hits for e in fleet.engines)
    served = [sum(1 for f in fleet.done if f.worker is w) for w in fleet.workers]
    reasons: dict[str, int] = {}
    for f in fleet.done:
        reasons[f.reason] = reasons.get(f.reason, 0) + 1
    errors = [abs(f.predicted_ttft_s * 1000 - t) / max(1.0, t) for f, t in ttfts
              if f.predicted_ttft_s > 0 and t]
    return {
        "requests": len(fleet.done),
        "hit_rate": hits / queries if queries else 0.0,
        "fleet_lru_bound": bound["fleet_lru_hit_rate"],
        "ttft_ms": {**{f"p{round(q * 100)}": percentile(ttft, q) for q in (0.5, 0.9, 0.99)},
                    "mean": statistics.fmean(ttft)},
        "busy_max_over_mean": max(fleet.busy_s) / statistics.fmean(fleet.busy_s),
        "requests_max_over_mean": max(served) / statistics.fmean(served),
        "predicted_ttft_error_median": statistics.median(errors) if errors else None,
        "reasons": reasons,
        "held": sum(1 for f in fleet.done if f.held),  # by the prefill gate
        # the one figure of this machine, not of simulated time: what a decision costs the
        # router's CPU (parse, key, signals, rank), which live adds to every request's hop
        "decide_cpu_us_p50": statistics.median(fleet.decide_cpu_ns) / 1000.0,
    }


def router_config(policy: str, extra: list[str]) -> RouterConfig:
    """The router's own flags (``--router-extra``), parsed as ``prefix-router serve`` does."""
    parser = argparse.ArgumentParser(prog="router-extra")
    add_arguments(parser)
    args = vars(parser.parse_args(extra))
    args["policy"] = policy
    return load_config(args, env={})


def run(cfg: RunConfig, gap_s: float = BURST_GAP_S, jitter_seed: int | None = None
        ) -> dict[str, Any]:
    """One replay; ``jitter_seed``: each request moved by up to ``gap_s`` more (a repeat)."""
    requests = make_workload(cfg.workload, **cfg.workload_opts)
    blocks, _ = plan_blocks(cfg, requests)
    bound = bounds.compute(requests, blocks, cfg.workers).as_dict()
    jitter = None if jitter_seed is None else random.Random(jitter_seed)
    oracle = cfg.policy == ORACLE  # the router's cheapest decision, then overridden
    fleet = asyncio.run(replay(spaced(requests, gap_s, jitter),
                               router_config("round_robin" if oracle else cfg.policy,
                                             cfg.router_extra),
                               cfg.workers, cfg.profile, blocks, oracle))
    return summary(fleet, bound)


def repeated(cfg: RunConfig, repeats: int, gap_s: float = BURST_GAP_S) -> dict[str, Any]:
    """``repeats`` replays, each request moved by a different jitter: the TTFT percentiles'
    means, and their spread (``ttft_ms_sd``). A replay is deterministic, but moving a burst's
    requests by a fraction of a millisecond changes which of them shares a step, and the
    later decisions diverge from there: the spread is what a single replay's figure is
    worth (the other fields are the first repeat's)."""
    runs = [run(cfg, gap_s, jitter_seed=k) for k in range(repeats)]
    first = runs[0]
    first["ttft_ms"] = {q: statistics.fmean(r["ttft_ms"][q] for r in runs)
                        for q in first["ttft_ms"]}
    first["ttft_ms_sd"] = {q: statistics.pstdev(r["ttft_ms"][q] for r in runs)
                           for q in PERCENTILES}
    first["repeats"] = repeats
    return first


def compare(args: argparse.Namespace) -> None:
    """Every named policy on the same workload, for one seed or several; markdown on stdout.
    Why several: a p99 over 1,200 requests is the 12th slowest, and one seed's workload can
    favour one policy by a few per cent that the next seed takes back."""
    from bench.cli import run_config  # the live bench's options, shared
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else [args.seed]
    policies = args.policies.split(",")
    gap_s = BURST_GAP_S if args.burst_gap_ms is None else args.burst_gap_ms / 1000.0
    rows = []
    for seed in seeds:
        args.seed = seed
        for policy in policies:
            cfg = run_config(args, policy=policy)
            result = repeated(cfg, args.repeats, gap_s) if args.repeats > 1 \
                else run(cfg, gap_s)
            rows.append((policy, seed, result))
            print(f"[offline] {policy} seed {seed}: {orjson.dumps(result).decode()}", flush=True)
    print(f"\n`python -m bench offline {' '.join(args.argv[1:])}`\n")
    print("| policy | seed | hit rate | % of fleet-LRU bound | TTFT p50 / p90 / p99 (ms) | "
          "max/mean busy | max/mean req | predicted TTFT error (median) | "
          "decision CPU p50 (µs, this machine) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for policy, seed, r in rows:
        err = r["predicted_ttft_error_median"]
        print(f"| {policy} | {seed} | {r['hit_rate']:.1%} | "
              f"{r['hit_rate'] / r['fleet_lru_bound']:.1%} | {_percentiles(r)} | "
              f"{r['busy_max_over_mean']:.2f} | {r['requests_max_over_mean']:.2f} | "
              f"{'–' if err is None else f'{err:.0%}'} | {r['decide_cpu_us_p50']:,.0f} |")
    if len(policies) > 1:
        print(ratio_lines(policies[0], rows))


def _percentiles(result: dict[str, Any]) -> str:
    """p50 / p90 / p99, each with its spread over repeats when there were several."""
    t, sd = result["ttft_ms"], result.get("ttft_ms_sd")
    return " / ".join(f"{t[q]:,.0f}" + (f" ±{sd[q]:,.0f}" if sd else "") for q in PERCENTILES)


def ratio_lines(first: str, rows: list[tuple[str, int, dict[str, Any]]]) -> str:
    """``first``'s TTFT over the best other policy's, per seed and percentile (<= 1 beats
    every other), and the geometric mean over seeds."""
    seeds = sorted({seed for _, seed, _ in rows})
    ratios = {q: [] for q in PERCENTILES}
    lines = [f"\n{first} against the best other policy (TTFT ratio; <= 1.00 beats all):\n"]
    for seed in seeds:
        mine = next(r for p, s, r in rows if p == first and s == seed)["ttft_ms"]
        others = [r["ttft_ms"] for p, s, r in rows if p != first and s == seed]
        cells = []
        for q in PERCENTILES:
            ratio = mine[q] / min(o[q] for o in others)
            ratios[q].append(ratio)
            cells.append(f"{q} {ratio:.2f}")
        lines.append(f"- seed {seed}: " + ", ".join(cells))
    means = ", ".join(f"{q} {statistics.geometric_mean(ratios[q]):.3f}" for q in PERCENTILES)
    lines.append(f"- geometric mean over {len(seeds)} seed(s): {means}")
    return "\n".join(lines)
