"""``prefix-router demo``: the gateway in front of a local simulated fleet, on embedded defaults.

It starts simulated vLLM workers (engine_worker.sim) as child processes, serves the router
in this process with in-memory residency, routes a few RAG requests so the warm hit is
visible (same document -> same worker, cached tokens, shorter simulated TTFT), then keeps
serving until Ctrl-C so you can point any OpenAI client at it.
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


async def _ask(session: aiohttp.ClientSession, base: str, doc: str, question: str) -> None:
    body = {"model": MODEL, "max_tokens": 12, "messages": [
        {"role": "system", "content": "Answer from the retrieved document."},
        {"role": "user", "content": DOCS[doc] * 60 + "\nQuestion: " + question}]}
    started = time.perf_counter()
    async with session.post(base + "/v1/chat/completions", json=body) as resp:
        answer = await resp.json()
    usage = answer.get("usage", {})
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    print(f"  doc={doc:<9} -> worker {resp.headers.get('X-Prefix-Router-Worker')} "
          f"({resp.headers.get('X-Prefix-Router-Reason')}): prompt {usage.get('prompt_tokens')}"
          f" tokens, {cached} cached, {1000 * (time.perf_counter() - started):.0f} ms")


async def run_demo(workers: int, port: int) -> None:
    fleet = _start_workers(workers)
    urls = ",".join(url for _, url in fleet)
    config = load_config({"workers": urls, "port": port, "health_interval_s": 0.5}, env={})
    stop = asyncio.Event()
    server = asyncio.create_task(serve(config, stop))
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            await _wait_ready(session, base)
            print(f"prefix-router on {base} in front of {workers} simulated workers "
                  f"({MODEL}); routing three requests:")
            await _ask(session, base, "kv-cache", "What is a block?")
            await _ask(session, base, "kv-cache", "How big is a block?")
            await _ask(session, base, "lmcache", "Where can caches live?")
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


async def _wait_ready(session: aiohttp.ClientSession, base: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(aiohttp.ClientError):
            async with session.get(base + "/ready") as resp:
                if resp.status == 200:
                    return
        await asyncio.sleep(0.2)
    raise RuntimeError("no simulated worker became healthy within 60 s")
