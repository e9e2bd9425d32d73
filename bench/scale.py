"""``python -m bench scale``: the routing decision in process, at fleet scale.

No HTTP: the pipeline's own steps, as the request handler calls them (fleet, key,
candidates, signals, rank), over the in-memory residency. Residency is filled
with R resident blocks spread over N workers (chains of 64 blocks, as long RAG prompts
produce), and half the decisions are for resident prompts, half for cold ones.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import multiprocessing
import os
import random
import shlex
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from router.fleet.workers import Worker, WorkerPool
from router.infra.metrics import RouterMetrics
from router.residency.memory import MemoryResidency
from router.routing.keys import prompt_key
from router.routing.pipeline import Pipeline
from router.routing.policies import Decision, make_policy

BLOCK_CHARS, MAX_BLOCKS, KEY_BLOCKS, CHAIN = 256, 256, 32, 64


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def _one(n_workers: int, resident: int, decisions: int,
               policy_name: str = "predicted_ttft") -> dict[str, Any]:
    rng = random.Random(f"scale:{n_workers}:{resident}")
    workers = [Worker(id=f"w{i}", url=f"http://w{i}", healthy=True) for i in range(n_workers)]
    ids = [w.id for w in workers]
    prompts = [(" ".join(f"doc{d} word{i}" for i in range(1400))).encode() for d in range(200)]
    gc.collect()
    rss0 = rss_bytes()
    residency = MemoryResidency(default_capacity=max(CHAIN, resident // n_workers + CHAIN))
    t0 = time.perf_counter()
    chains = resident // CHAIN
    for c in range(chains):  # synthetic resident chains (random 8-byte block hashes)
        residency.record(ids[c % n_workers], [rng.randbytes(8) for _ in range(CHAIN)])
        if c % 64 == 63:  # apply the batch: queued chains are garbage, not residency, and
            await asyncio.sleep(0)  # 4,096 of them held ~13 MB of RSS (128 B a block at 100 k)
    await asyncio.sleep(0)
    # resident prompts: real text whose chains are recorded on a worker
    for d, p in enumerate(prompts):
        residency.record(ids[d % n_workers],
                         prompt_key(p, "m", BLOCK_CHARS, MAX_BLOCKS, KEY_BLOCKS).chain)
    await asyncio.sleep(0)
    fill_s = time.perf_counter() - t0
    rss1 = rss_bytes()
    pool = WorkerPool()
    for w in workers:
        w.in_flight = 4  # equal loads: every worker is under the bound
        pool.add(w)
    pipeline = Pipeline(pool, make_policy(policy_name), residency, RouterMetrics(),
                        block_chars=BLOCK_CHARS, max_blocks=MAX_BLOCKS, key_blocks=KEY_BLOCKS)

    async def decide(prompt: bytes) -> tuple[Decision, int]:
        fleet = pipeline.fleet(None)
        request = await pipeline.key({}, "m", False, lambda _: prompt, None, fleet)
        t_match = time.perf_counter_ns()
        candidates = await pipeline.candidates(request, fleet)
        await pipeline.annotate(request, candidates)
        match = time.perf_counter_ns() - t_match
        return pipeline.rank(request, candidates), match

    for i in range(4):  # untimed: build the ring once (a router builds it per membership)
        await decide(prompts[i])
    times: dict[bool, list[int]] = {True: [], False: []}  # resident prompt? -> ns
    match_ns = []
    cpu_ns = []  # the decision's own CPU time: on a shared box, wall time also counts the
    # moments the process waits for a core
    warm = 0
    for i in range(decisions):
        resident_prompt = i % 2 == 0
        prompt = (prompts[i % len(prompts)] if resident_prompt
                  else rng.randbytes(4096).hex().encode())
        t, c = time.perf_counter_ns(), time.thread_time_ns()
        decision, match = await decide(prompt)
        cpu_ns.append(time.thread_time_ns() - c)
        times[resident_prompt].append(time.perf_counter_ns() - t)
        match_ns.append(match)
        warm += decision.ranked[0].matched_blocks > 0
    every = np.asarray(times[True] + times[False]) / 1000.0
    res = np.asarray(times[True]) / 1000.0
    cold = np.asarray(times[False]) / 1000.0
    total = sum(residency.resident_blocks(w) for w in ids)
    return {"workers": n_workers, "resident_blocks": total, "decisions": decisions,
            "decision_us_p50": float(np.percentile(every, 50)),
            "decision_us_p99": float(np.percentile(every, 99)),
            "decision_cpu_us_p50": float(np.percentile(np.asarray(cpu_ns) / 1000.0, 50)),
            "decision_cpu_us_p99": float(np.percentile(np.asarray(cpu_ns) / 1000.0, 99)),
            "resident_us_p50": float(np.percentile(res, 50)),
            "resident_us_p99": float(np.percentile(res, 99)),
            "cold_us_p50": float(np.percentile(cold, 50)),
            "cold_us_p99": float(np.percentile(cold, 99)),
            "match_us_p50": float(np.percentile(np.asarray(match_ns) / 1000.0, 50)),
            "warm_fraction": warm / decisions, "fill_s": fill_s,
            "rss_mib": (rss1 - rss0) / 2**20, "bytes_per_block": (rss1 - rss0) / max(1, total)}


def _row(n_workers: int, resident: int, decisions: int) -> dict[str, Any]:
    return asyncio.run(_one(n_workers, resident, decisions))


def scale(args: argparse.Namespace) -> list[dict[str, Any]]:
    caption = "python -m bench " + shlex.join(args.argv)
    rows = []
    # one fresh process per row: RSS growth is then this row's residency, not memory freed
    # by a previous row and reused
    ctx = multiprocessing.get_context("spawn")
    for n in [int(x) for x in args.workers.split(",")]:
        for r in [int(x) for x in args.blocks.split(",")]:
            with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
                row = pool.submit(_row, n, r, args.decisions).result()
            rows.append(row)
            sys.stderr.write(f"[scale] {row}\n")
    lines = [f"`{caption}`", "", "| workers | resident blocks | decision p50 / p99 µs | "
             "decision CPU p50 / p99 µs | "
             "resident prompt p50 / p99 µs | cold prompt p50 / p99 µs | "
             "candidates + signals p50 µs | warm decisions | residency memory MiB | bytes/block |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['workers']:,} | {r['resident_blocks']:,} | {r['decision_us_p50']:.0f} / "
              f"{r['decision_us_p99']:.0f} | {r['decision_cpu_us_p50']:.0f} / "
              f"{r['decision_cpu_us_p99']:.0f} | {r['resident_us_p50']:.0f} / "
              f"{r['resident_us_p99']:.0f} | {r['cold_us_p50']:.0f} / {r['cold_us_p99']:.0f} | "
              f"{r['match_us_p50']:.0f} | {r['warm_fraction']:.0%} | {r['rss_mib']:.0f} | "
              f"{r['bytes_per_block']:.0f} |" for r in rows]
    md = "\n".join(lines) + "\n"
    out: Path = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    (out / "scale.md").write_text(md)
    (out / "scale.json").write_bytes(orjson.dumps({"caption": caption, "rows": rows},
                                                  option=orjson.OPT_INDENT_2))
    print(md)
    return rows
