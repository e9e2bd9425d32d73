"""Claim 4: preemption by recomputation against swapping to CPU, by block size.

The claim (vLLM paper, sec. 7.3 and fig. 19): recomputation costs within 20 % of
swapping for block sizes 16-64, and swapping gets much worse with small blocks (many small
PCIe copies). Note that vLLM 0.32 (V1) has no swap preemption at all: it always recomputes
(with its prefix cache on, a preempted request's blocks often still hit).

An over-subscribed burst: all requests arrive at once and their final KV is 1.5x the
cache, so running sequences are preempted as their answers grow. The cache holds a fixed
number of tokens (the same GPU memory at every block size). Per preemption of a sequence
holding T tokens the roofline charges, for a swap, T x KV bytes per token over PCIe out and
again in, plus one copy per block, per layer, for K and V at ``swap_copy_overhead_us``
each; for a recompute, the prefill FLOPs of T tokens (their blocks are freed; prefix
caching off, as in the paper, unless stated). Resume latency: from the preemption to the
sequence's next token (includes waiting for blocks); end-to-end: each request's latency.
"""

from __future__ import annotations

import statistics

from bench.engine.common import Job, RunResult, Table, drive, make_engine, ms, seeded, tokens
from bench.engine.plotting import line_plot
from engine_worker.sim.profiles import Profile, load_profile
from engine_worker.sim.roofline import StepCost

BLOCK_SIZES = (8, 16, 32, 64, 128)
MODES = {"swap": {"preemption_mode": "swap", "enable_prefix_caching": False},
         "recompute": {"preemption_mode": "recompute", "enable_prefix_caching": False},
         "recompute + prefix cache": {"preemption_mode": "recompute"}}


def shape(quick: bool) -> tuple[int, int, int, int]:
    """(requests, prompt tokens, output tokens, cache tokens): final KV = 1.5x the cache."""
    return (24, 512, 512, 16384) if quick else (48, 1024, 1024, 65536)


def burst(quick: bool, seed: int = 0) -> list[Job]:
    count, prompt, output, _ = shape(quick)
    rng = seeded("swap-burst", seed)
    return [Job(tokens(rng, prompt), output) for _ in range(count)]


def measure(profile: str, block_size: int, mode: str, quick: bool) -> RunResult:
    cache_tokens = shape(quick)[3]
    engine = make_engine(profile, block_size=block_size,
                         num_gpu_blocks=cache_tokens // block_size, **MODES[mode])
    return drive(engine, burst(quick))


def swap_seconds(profile: Profile, tokens_held: int, block_size: int) -> float:
    """One swap out and back in of a sequence holding ``tokens_held`` tokens."""
    cost = StepCost()
    cost.add_swap(profile, tokens_held, block_size)
    eff, gpu = profile.eff, profile.gpu
    one_way = (cost.pcie_bytes / (gpu.pcie_gbps * 1e9 * eff.pcie)
               + cost.pcie_copies * eff.swap_copy_overhead_us / 1e6)
    return 2 * one_way


def recompute_seconds(profile: Profile, tokens_held: int) -> float:
    """The prefill FLOPs of ``tokens_held`` tokens, at the profile's achieved compute."""
    cost = StepCost()
    cost.add_tokens(profile, tokens_held, 0)
    return cost.flops / (profile.gpu.bf16_tflops * 1e12 * profile.eff.compute)


def _resumes(res: RunResult) -> list[float]:
    return [r for s in res.stats for r in s.resume_s]


def run(profiles: list[str], quick: bool) -> list[Table]:
    count, prompt, output, cache = shape(quick)
    table = Table("swap", "4. Swap against recompute under an over-subscribed burst",
                  ["profile (PCIe)", "block size", "preemptions swap / recompute",
                   "per-preemption cost swap / recompute (ms)", "recompute as % of swap",
                   "mean resume latency swap / recompute / recompute+cache (ms)",
                   "mean end-to-end swap / recompute / recompute+cache (s)",
                   "e2e recompute as % of swap"])
    series: dict[str, tuple[list[float], list[float]]] = {}
    for profile in profiles:
        prof = load_profile(profile)
        link = (f"{prof.gpu.pcie_gbps:g} GB/s x {prof.eff.pcie:g}, "
                f"{prof.eff.swap_copy_overhead_us:g} us/copy")
        xs, swap_ms, rec_ms = [], [], []
        for bs in BLOCK_SIZES:
            runs = {mode: measure(profile, bs, mode, quick) for mode in MODES}
            held = _held_tokens(runs["swap"], prompt)
            s_cost = swap_seconds(prof, held, bs)
            r_cost = recompute_seconds(prof, held)
            resume = [statistics.fmean(_resumes(r)) if _resumes(r) else float("nan")
                      for r in runs.values()]
            e2e = [r.mean(lambda s: s.e2e) for r in runs.values()]
            table.rows.append([
                f"{profile} ({link})", str(bs),
                f"{runs['swap'].preemptions} / {runs['recompute'].preemptions}",
                f"{ms(s_cost)} / {ms(r_cost)}", f"{100 * r_cost / s_cost:.0f} %",
                " / ".join(ms(v) for v in resume), " / ".join(f"{v:.2f}" for v in e2e),
                f"{100 * e2e[1] / e2e[0]:.0f} %"])
            xs.append(bs)
            swap_ms.append(1000 * s_cost)
            rec_ms.append(1000 * r_cost)
        series[f"{profile}: swap out + in"] = (xs, swap_ms)
        series[f"{profile}: recompute"] = (xs, rec_ms)
    table.plot = line_plot(
        "engine-swap.png", series,
        title=f"Cost of one preemption by block size (a sequence holding the mean preempted "
        f"length; {count} requests of {prompt}+{output} tokens on a {cache:,}-token cache)",
        xlabel="block size (tokens, log scale)", ylabel="simulated ms per preemption "
        "(swap: out and back in)", logx=True, logy=True)
    table.notes.append(
        f"Burst: {count} requests of {prompt} prompt + {output} output tokens at once on a "
        f"cache of {cache:,} tokens (final KV 1.5x the cache). PCIe: the profile's "
        "`pcie_gbps` (H100: PCIe Gen5 x16, 64 GB/s per direction; A100: Gen4 x16, 32 GB/s) "
        "times `efficiency.pcie`; per-copy cost `efficiency.swap_copy_overhead_us` "
        "(engine_worker/sim/profiles.yaml). Per-preemption cost is for a sequence holding "
        "the mean number of tokens swapped in that run.")
    return [table]


def _held_tokens(res: RunResult, prompt: int) -> int:
    """Mean tokens a preempted sequence held (prompt + answer so far), from the swap run."""
    counts = res.engine.counters
    return counts.preempted_tokens // counts.preemptions if counts.preemptions else prompt
