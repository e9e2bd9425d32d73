"""Claim 1: paged KV against a contiguous reservation of max_model_len per request.

The claim (vLLM paper, fig. 2): 96.3 % of KV memory holds token state with paged
allocation against 20.4-38.2 % for Orca-style contiguous reservation. Measured here on the
simulator's own KV manager in both modes (``EngineConfig.kv_allocation``), on a RAG mix
(one retrieved context of ``context`` tokens, 50-500-token answers, no two requests
sharing a block, prefix caching off in both so only the allocator differs) at rising
concurrency (a closed loop of C clients). Every step's KV is split, weighted by the step's
simulated duration, into token state (written), reserved (slots the request will still
write), internal fragmentation (reserved slots it never writes), external fragmentation
(free blocks in runs too short for the next waiting request) and free.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.engine.common import Job, Table, drive, make_engine, num, pct, seeded, tokens
from bench.engine.plotting import line_plot
from engine_worker.sim.engine import Engine
from engine_worker.sim.profiles import load_profile

MODES = {"paged": {"kv_allocation": "paged"},
         "contiguous max_model_len": {"kv_allocation": "contiguous", "contiguous_reserve": "max"},
         "contiguous exact (oracle)": {"kv_allocation": "contiguous",
                                       "contiguous_reserve": "request"}}
ANSWER = (50, 500)


@dataclass
class Split:
    """Slot-seconds of each kind of KV use, summed over steps."""

    token: float = 0.0
    reserved: float = 0.0
    internal: float = 0.0
    external: float = 0.0
    total: float = 0.0

    def observe(self, engine: Engine, dt: float) -> None:
        kv, bs = engine.kv, engine.kv.block_size
        for seq in engine.running:
            blocks = kv.seqs.get(seq.seq_id)
            if blocks is None:
                continue
            alloc = (len(blocks.block_ids) + len(blocks.reserved)) * bs
            used = len(blocks.token_ids)
            final = min(alloc, len(seq.req.prompt) + seq.req.max_tokens)
            self.token += used * dt
            self.reserved += max(0, final - used) * dt
            self.internal += (alloc - final) * dt
        if engine.waiting:
            head = engine.waiting[0].req
            reserve = engine._reservation(len(head.prompt), head.max_tokens)
            self.external += kv.external_fragmentation(reserve) * bs * dt
        self.total += kv.num_blocks * bs * dt

    @property
    def utilisation(self) -> float:
        """Token state over the KV the allocator took (held + externally fragmented)."""
        held = self.token + self.reserved + self.internal + self.external
        return self.token / held if held else 0.0


def context_tokens(profile: str) -> int:
    """3 k-token contexts where the model's max_model_len allows, else what fits."""
    max_len = load_profile(profile).model.max_model_len
    return min(3000, max_len - ANSWER[1] - 48)


def jobs(profile: str, count: int, seed: int = 0) -> list[Job]:
    rng = seeded("utilisation", seed)
    ctx = context_tokens(profile)
    return [Job(tokens(rng, ctx), int(rng.integers(ANSWER[0], ANSWER[1] + 1)))
            for _ in range(count)]


def measure(profile: str, mode: str, concurrency: int, work: list[Job],
            num_gpu_blocks: int | None = None) -> dict[str, float]:
    engine = make_engine(profile, enable_prefix_caching=False, num_gpu_blocks=num_gpu_blocks,
                         **MODES[mode])
    split = Split()
    res = drive(engine, work, concurrency, split.observe)
    return {"utilisation": split.utilisation, "token": split.token / split.total,
            "reserved": split.reserved / split.total, "internal": split.internal / split.total,
            "external": split.external / split.total, "tokens_per_s": res.tokens_per_s,
            "peak_running": res.peak_running, "peak_clean": res.peak_running_before_preemption,
            "preemptions": res.preemptions}


def levels(quick: bool) -> list[int]:
    return [16, 64, 256] if quick else [8, 16, 32, 64, 128, 256]


def run(profiles: list[str], quick: bool) -> list[Table]:
    table = Table("utilisation", "1. KV utilisation: paged against contiguous reservation",
                  ["profile", "allocator", "clients", "KV utilisation", "token / reserved / "
                   "internal / external (% of KV)", "most running before a preemption",
                   "preemptions", "output tok/s"])
    series: dict[str, tuple[list[float], list[float]]] = {}
    for profile in profiles:
        for mode in MODES:
            xs, ys = [], []
            for c in levels(quick):
                count = max(c + c // 2 if quick else 2 * c, 48)
                m = measure(profile, mode, c, jobs(profile, count))
                table.rows.append([profile, mode, str(c), pct(m["utilisation"]),
                                   " / ".join(f"{100 * m[k]:.1f}" for k in
                                              ("token", "reserved", "internal", "external")),
                                   str(m["peak_clean"]), str(m["preemptions"]),
                                   num(m["tokens_per_s"])])
                xs.append(c)
                ys.append(m["tokens_per_s"])
            series[f"{profile}, {mode}"] = (xs, ys)
    table.plot = line_plot(
        "engine-utilisation.png", series, title="Throughput by KV allocator, RAG mix "
        "(3 k-token contexts, 50-500-token answers; OPT-13B: 1.5 k, its max_model_len is 2,048)",
        xlabel="concurrent clients (closed loop, log scale)",
        ylabel="output tokens per simulated second", logx=True)
    table.notes.append(
        "KV utilisation = token state / (KV held by requests + free blocks too fragmented to "
        "use), time-weighted over the run; the four shares are of the whole KV cache. "
        "Contiguous never preempts (it reserves up front); its cap on running requests is "
        "the number of reservations that fit.")
    return [table]
