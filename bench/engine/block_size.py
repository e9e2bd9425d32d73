"""Claim 5: block size 16 for chat, 32 for RAG, 64 for long documents?

Short replays through the router with the existing bench machinery (``bench.runner.run``:
simulated workers as processes, prefix-router in front, the open-loop client), on the RAG
and Mooncake workloads at block sizes 16, 32 and 64, every run with the same KV memory
per worker (in tokens; blocks = tokens / block size) and the default policy. Reported:
the fleet's prefix hit rate (the engines' counters) and TTFT, client-side and the engines'
own. The simulator's step time does not depend on the block size (no attention-kernel
effect is modelled), so here block size acts only through what is cached and evicted.
"""

from __future__ import annotations

from typing import Any

from bench.engine.common import Table, pct
from bench.engine.plotting import bar_plot
from bench.runner import RunConfig, plan_blocks
from bench.runner import run as run_bench
from bench.workloads import make_workload

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


def run(profiles: list[str], quick: bool) -> list[Table]:
    profile = profiles[0]
    table = Table("block_size", "5. Block size: hit rate and TTFT through the router",
                  ["workload", "block size", "KV blocks per worker", "fleet hit rate",
                   "TTFT p50 / p99, client (ms)", "TTFT p50 / p99, engines (ms)",
                   "output tok/s"])
    groups, bars = [], {f"block size {bs}": [] for bs in BLOCK_SIZES}
    scale = 0.5 if quick else 1.0
    for workload, opts in workloads(quick).items():
        groups.append(workload)
        for bs in BLOCK_SIZES:
            res = measure(workload, opts, bs, scale, profile)
            c, e = res["ttft_ms"], res["worker_ttft_ms"]
            table.rows.append([workload, str(bs), f"{res['meta']['num_gpu_blocks']:,}",
                               pct(res["hit_rate"] or 0.0), f"{_ms(c['p50'])} / {_ms(c['p99'])}",
                               f"{_ms(e['p50'])} / {_ms(e['p99'])}",
                               f"{res['throughput']['output_tokens_per_s'] or 0:,.0f}"])
            bars[f"block size {bs}"].append(100 * (res["hit_rate"] or 0.0))
    table.plot = bar_plot(
        "engine-block-size.png", groups, bars,
        title=f"Fleet prefix hit rate by block size ({WORKERS} simulated {profile} workers "
        "behind prefix-router, predicted_ttft; same KV memory per worker)",
        xlabel="workload", ylabel="prefix cache hit rate (% of prompt tokens)")
    table.notes.append(
        f"{WORKERS} workers, each with KV for 1.5x the working set / {WORKERS} tokens, "
        f"time scale {scale} (simulated ms = wall ms / scale). Engine TTFT is the engines' "
        "`vllm:time_to_first_token_seconds` (bucketed, so p50/p99 are interpolated).")
    return [table]


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x:,.0f}"
