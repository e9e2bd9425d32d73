"""What every claim needs: profiles, an offline driver of the simulated engine, tables.

Why offline: the claims are about the engine's KV manager and scheduler, not the network.
Driving ``Engine.add_request`` / ``Engine.step`` on simulated time (no event loop, no
sleeping) gives the model's numbers exactly and fast enough for ``--quick`` on two cores.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from engine_worker.sim.engine import Engine
from engine_worker.sim.engine_config import EngineConfig
from engine_worker.sim.profiles import Profile, load_profile
from engine_worker.sim.request import RequestHandle, RequestStats

PROFILES = ("llama-3-8b@h100-80gb", "opt-13b@a100-80gb")
RESULTS = Path(__file__).resolve().parent.parent / "results"


@dataclass(frozen=True)
class Job:
    prompt: list[int]
    max_tokens: int
    arrival_s: float = 0.0  # open loop (drive(..., open_loop=True)): when it is sent


@dataclass
class RunResult:
    stats: list[RequestStats]
    makespan_s: float
    preemptions: int
    peak_running: int
    peak_running_before_preemption: int
    peak_used_blocks: int
    engine: Engine

    @property
    def output_tokens(self) -> int:
        return sum(s.completion_tokens for s in self.stats)

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.makespan_s if self.makespan_s else 0.0

    def mean(self, what: Callable[[RequestStats], float | None]) -> float:
        vals = [v for s in self.stats if (v := what(s)) is not None]
        return statistics.fmean(vals) if vals else float("nan")


Observer = Callable[[Engine, float], None]


def tokens(rng: np.random.Generator, n: int, vocab: int = 32000) -> list[int]:
    """n random token ids: distinct documents share no block."""
    return rng.integers(0, vocab, n).tolist()


def seeded(name: str, seed: int = 0) -> np.random.Generator:
    """A generator per (claim, seed): every claim's inputs are reproducible on their own."""
    return np.random.default_rng([seed, *name.encode()])


def make_engine(profile: str | Profile, **config: object) -> Engine:
    """A simulated engine with fixed hash seed (reruns give the same blocks)."""
    cfg = EngineConfig(hash_seed="0", **config)  # type: ignore[arg-type]
    return Engine(load_profile(profile) if isinstance(profile, str) else profile, cfg)


def drive(engine: Engine, jobs: Sequence[Job], concurrency: int | None = None,
          observe: Observer | None = None, open_loop: bool = False) -> RunResult:
    """Run jobs to completion: all at t=0 (a burst), ``concurrency`` at a time (a closed
    loop: the next job arrives when one finishes), or each at its ``arrival_s`` (open
    loop; an idle engine skips ahead to the next arrival). ``observe`` sees every step."""
    pending = list(reversed(jobs))
    live: list[RequestHandle] = []
    done: list[RequestStats] = []
    peak = peak_clean = 0
    limit = concurrency or len(jobs)
    while pending or live:
        if open_loop and not live and pending:
            engine.sim_now = max(engine.sim_now, pending[-1].arrival_s)
        while pending and len(live) < limit and (
                not open_loop or pending[-1].arrival_s <= engine.sim_now):
            job = pending.pop()
            live.append(engine.add_request(job.prompt, job.max_tokens))
        dt = engine.step()
        if dt is None:
            raise RuntimeError("the engine cannot schedule anything (a job never fits)")
        running = engine.num_running_requests
        peak = max(peak, running)
        if not engine.counters.preemptions:
            peak_clean = max(peak_clean, running)
        if observe is not None:
            observe(engine, dt)
        if any(h.done for h in live):
            done += [h.stats for h in live if h.done]
            live = [h for h in live if not h.done]
    return RunResult(done, engine.sim_now, engine.counters.preemptions, peak, peak_clean,
                     engine.kv.peak_used_blocks, engine)


@dataclass
class Table:
    """One claim's result: a markdown table, what it shows, and where its plot went."""

    name: str
    title: str
    header: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    plot: str | None = None

    def markdown(self, command: str) -> str:
        lines = [f"### {self.title}", "", f"`{command}`", "",
                 "| " + " | ".join(self.header) + " |",
                 "|" + "---|" * len(self.header)]
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        if self.plot:
            lines += ["", f"![{self.title}](results/{self.plot})"]
        if self.notes:
            lines += ["", *self.notes]
        return "\n".join(lines) + "\n"


def pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def ms(x: float) -> str:
    return f"{1000 * x:,.1f}"


def num(x: float, digits: int = 0) -> str:
    return f"{x:,.{digits}f}"
