"""Claim 5: block size 16 for chat, 32 for RAG, 64 for long documents?

Short replays through the router with the existing bench machinery (``bench.runner.run``:
simulated workers as processes, prefix-router in front, the open-loop client), on the RAG
and Mooncake workloads at block sizes 16, 32 and 64, every run with the same KV memory
per worker (in tokens; blocks = tokens / block size) and the default policy. Reported:
the fleet's prefix hit rate (the engines' counters) and TTFT, client-side and the engines'
own. The simulator's step time does not depend on the block size (no attention-kernel
effect is modelled), so here block size acts only through what is cached and evicted.

Routing and HTTP timing on a busy 2-core machine add noise to those runs (the policy
reads load), so each block size is also replayed offline, deterministically: the same
request sequence into one simulated engine holding the fleet's KV memory, on simulated
time, at a quarter of the arrival rate (one engine doing the work of four): the hit rate
an ideal partition of the fleet's cache would get, and that engine's TTFT.
"""

from __future__ import annotations

from typing import Any

from bench.engine.common import Job, Table, drive, make_engine, pct
from bench.engine.plotting import bar_plot
from bench.runner import RunConfig, plan_blocks
from bench.runner import run as run_bench
from bench.workloads import make_workload
from engine_worker.sim.profiles import load_profile
from engine_worker.sim.tokenizer import SimTokenizer

BLOCK_SIZES = (16, 32, 64)
WORKERS = 4


def workloads(quick: bool) -> dict[str, dict[str, Any]]:
    """RAG at 10 requests/s (half the 8-worker comparisons' rate, for 4 workers); the
    Mooncake conversation sample of bench/README.md's comparisons, shorter when quick."""
    if quick:
        return {"rag": {"count": 160, "rate": 10.0, "send_context_hash": False, "seed": 0},
                "mooncake": {"duration_s": 120, "sample_conversations": 0.2,
                             "arrival_scale": 0.25, "seed": 0}}
    return {"rag": {"count": 600, "rate": 10.0, "send_context_hash": False, "seed": 0},
            "mooncake": {"duration_s": 600, "sample_conversations": 0.2,
                         "arrival_scale": 0.25, "seed": 0}}


def cache_tokens(workload: str, opts: dict[str, Any]) -> int:
    """Per-worker KV in tokens: the fleet holds 1.5x the working set (the cache-bound regime
    of bench/README.md's comparisons), the same memory at every block size."""
    cfg = RunConfig(workload=workload, workload_opts=opts, workers=WORKERS,
                    cache_fleet_ratio=1.5)
    blocks16, _ = plan_blocks(cfg, make_workload(workload, **opts))
    return blocks16 * 16


def measure(workload: str, opts: dict[str, Any], block_size: int, time_scale: float,
            profile: str) -> dict[str, Any]:
    tokens = cache_tokens(workload, opts)
    cfg = RunConfig(workload=workload, workload_opts=opts, policy="predicted_ttft",
                    workers=WORKERS, profile=profile, time_scale=time_scale,
                    num_gpu_blocks=tokens // block_size, block_size=block_size,
                    label=f"{workload}-bs{block_size}", progress=False)
    return run_bench(cfg)


def offline(workload: str, opts: dict[str, Any], block_size: int,
            profile: str) -> dict[str, float]:
    """The whole sequence into one engine with the fleet's KV, on simulated time."""
    requests = make_workload(workload, **opts)
    tokenizer = SimTokenizer(load_profile(profile).model.vocab)
    jobs = [Job(tokenizer.encode(r.prompt), r.max_tokens, WORKERS * r.arrival_s)
            for r in requests]
    longest = max(len(j.prompt) + j.max_tokens for j in jobs)
    engine = make_engine(profile, block_size=block_size,
                         num_gpu_blocks=WORKERS * cache_tokens(workload, opts) // block_size,
                         max_model_len=-(-(longest + 16) // 1024) * 1024)
    res = drive(engine, jobs, open_loop=True)
    ttfts = sorted(s.ttft for s in res.stats if s.ttft is not None)
    c = engine.counters
    return {"hit_rate": c.prefix_hits / c.prefix_queries if c.prefix_queries else 0.0,
            "ttft_p50": ttfts[len(ttfts) // 2], "ttft_p99": ttfts[int(0.99 * (len(ttfts) - 1))]}


def run(profiles: list[str], quick: bool) -> list[Table]:
    profile = profiles[0]
    table = Table("block_size", "5. Block size: hit rate and TTFT through the router",
                  ["workload", "block size", "KV blocks per worker", "requests ok / sent",
                   "fleet hit rate",
                   "TTFT p50 / p99, client (ms)", "TTFT p50 / p99, engines (ms)",
                   "offline: hit rate", "offline: TTFT p50 / p99 (ms)"])
    groups: list[str] = []
    bars: dict[str, list[float]] = {f"block size {bs}, {how}": [] for bs in BLOCK_SIZES
                                    for how in ("through the router", "offline")}
    scale = 0.5 if quick else 1.0
    for workload, opts in workloads(quick).items():
        groups.append(workload)
        for bs in BLOCK_SIZES:
            res = measure(workload, opts, bs, scale, profile)
            off = offline(workload, opts, bs, profile)
            c, e = res["ttft_ms"], res["worker_ttft_ms"]
            n = res["requests"]
            table.rows.append([workload, str(bs), f"{res['meta']['num_gpu_blocks']:,}",
                               f"{n['ok']} / {n['total']}", pct(res["hit_rate"] or 0.0),
                               f"{_ms(c['p50'])} / {_ms(c['p99'])}",
                               f"{_ms(e['p50'])} / {_ms(e['p99'])}", pct(off["hit_rate"]),
                               f"{_ms(1000 * off['ttft_p50'])} / {_ms(1000 * off['ttft_p99'])}"])
            bars[f"block size {bs}, through the router"].append(100 * (res["hit_rate"] or 0))
            bars[f"block size {bs}, offline"].append(100 * off["hit_rate"])
    table.plot = bar_plot(
        "engine-block-size.png", groups, bars,
        title=f"Prefix hit rate by block size ({WORKERS} simulated {profile} workers behind "
        "prefix-router, predicted_ttft, and offline: one engine with the fleet's KV; same "
        "KV memory at every block size)",
        xlabel="workload", ylabel="prefix cache hit rate (% of prompt tokens)")
    table.notes.append(
        f"{WORKERS} workers, each with KV for 1.5x the working set / {WORKERS} tokens, "
        f"time scale {scale} (simulated ms = wall ms / scale). Engine TTFT is the engines' "
        "`vllm:time_to_first_token_seconds` (bucketed, so p50/p99 are interpolated). "
        "Requests not answered within 120 s of the last send are cancelled: on a 2-core "
        "machine shared with other jobs the simulated workers fall behind real time, so read "
        "the through-the-router columns as noisy and the offline columns as the model's.")
    return [table]


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x:,.0f}"
