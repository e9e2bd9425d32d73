"""``prefix-router demo``: the gateway in front of a local simulated fleet, on embedded defaults.

It starts simulated vLLM workers (engine_worker.sim) as child processes, serves the router
in this process with in-memory residency, routes a few RAG requests so the warm hit is
visible (same document -> same worker), then keeps serving until Ctrl-C so you can point
any OpenAI client at it. The figures printed are the engine's own: the cached tokens it
reported in usage, and its time to first token read off its
``vllm:time_to_first_token_seconds`` histogram before and after each request (the
modelled H100's time). Wall-clock time on this machine would mostly measure Python.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import time

import aiohttp

from router.cli import serve
from router.config import load_config

MODEL = "demo-llama-3-8b"
TTFT_SUM = "vllm:time_to_first_token_seconds_sum"
DOCS = {
    "kv-cache": "PagedAttention stores the KV cache of each sequence in fixed-size blocks. ",
    "lmcache": "LMCache keeps KV caches in CPU memory, on disk or in a shared store. ",
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start_workers(count: int) -> list[tuple[subprocess.Popen[bytes], str]]:
    fleet = []
    for _ in range(count):
        port = _free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "engine_worker.sim", "--host", "127.0.0.1", "--port",
             str(port), "--model", MODEL, "--profile", "llama-3-8b@h100-80gb",
             "--time-scale", "0.05", "--log-level", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        fleet.append((proc, f"http://127.0.0.1:{port}"))
    return fleet


async def _engine_ttft_sum(session: aiohttp.ClientSession, worker_url: str) -> float:
    async with session.get(worker_url + "/metrics") as resp:
        text = await resp.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(TTFT_SUM))


async def _ask(session: aiohttp.ClientSession, base: str, workers: dict[str, str], doc: str,
               question: str) -> None:
    body = {"model": MODEL, "max_tokens": 12, "messages": [
        {"role": "system", "content": "Answer from the retrieved document."},
        {"role": "user", "content": DOCS[doc] * 60 + "\nQuestion: " + question}]}
    before = {w: await _engine_ttft_sum(session, url) for w, url in workers.items()}
    async with session.post(base + "/v1/chat/completions", json=body) as resp:
        answer = await resp.json()
    worker = resp.headers.get("X-Prefix-Router-Worker", "")
    ttft = await _engine_ttft_sum(session, workers[worker]) - before[worker]
    usage = answer.get("usage", {})
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    print(f"  doc={doc:<9} -> worker {worker} ({resp.headers.get('X-Prefix-Router-Reason')}):"
          f" prompt {usage.get('prompt_tokens')} tokens, {cached} cached by the engine, "
          f"engine TTFT {1000 * ttft:.1f} ms")


async def run_demo(workers: int, port: int) -> None:
    fleet = _start_workers(workers)
    urls = ",".join(url for _, url in fleet)
    config = load_config({"workers": urls, "port": port, "health_interval_s": 0.5}, env={})
    stop = asyncio.Event()
    server = asyncio.create_task(serve(config, stop))
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            await _wait_ready(session, base, [url for _, url in fleet])
            print(f"prefix-router on {base} in front of {workers} simulated workers "
                  f"({MODEL}); routing three requests:")
            by_id = {f"w{i}": url for i, (_, url) in enumerate(fleet)}
            await _ask(session, base, by_id, "kv-cache", "What is a block?")
            await _ask(session, base, by_id, "kv-cache", "How big is a block?")
            await _ask(session, base, by_id, "lmcache", "Where can caches live?")
            print("  (engine TTFT: the modelled H100's prefill of the uncached tokens; the "
                  "warm repeat skips the document)")
        print(f"\nServing until Ctrl-C. Try:\n  curl -s {base}/v1/chat/completions "
              f"-H 'Content-Type: application/json' -d '{{\"model\": \"{MODEL}\", "
              f"\"messages\": [{{\"role\": \"user\", \"content\": \"hi\"}}]}}'", flush=True)
        await server
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await server
        for proc, _ in fleet:
            proc.terminate()
        for proc, _ in fleet:
            proc.wait(timeout=10)


async def _wait_ready(session: aiohttp.ClientSession, base: str, workers: list[str]) -> None:
    """Every worker up, not only the one the router's /ready needs: the demo reads each
    worker's metrics (a loaded machine starts the last ones seconds after the first)."""
    deadline = time.monotonic() + 60
    waiting = [base + "/ready", *(url + "/health" for url in workers)]
    while time.monotonic() < deadline:
        for url in list(waiting):
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(url) as resp:
                    if resp.status == 200:
                        waiting.remove(url)
        if not waiting:
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"not up within 60 s: {', '.join(waiting)}")
