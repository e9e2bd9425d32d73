"""``python -m bench.idle_lag``: one simulated worker's server time beyond its engine's TTFT,
idle against busy.

A request's client-side TTFT includes what the simulator's own process spends between
receiving it and sending its first token, beyond the engine's modelled TTFT (parsing,
tokenising, hashing blocks, the event loop). Live, that time was ~5 ms longer on a worker
with nothing in flight than on a busy one: a busy engine's loop, late behind the parse,
let the request join a step that had begun on the model's clock before it arrived, so the
parse was hidden only there (fixed in the engine: a request joins no step begun before its
arrival). This measures it on one worker with nothing else running: each prompt length
sent ``count`` times one after another, 1 s apart, 50 ms apart, and beside a long decode
on the same worker; the three columns should agree.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import subprocess
import sys

import aiohttp

from bench.fleet import free_port, wait_http
from bench.workloads.text import words

MODES = ("idle, 1 s apart", "idle, 50 ms apart", "beside a decode")
DECODE_PROMPT = 64  # tokens of the decode's own prompt; measured prompts are longer


async def _send(session: aiohttp.ClientSession, url: str, prompt: str,
                max_tokens: int = 1) -> None:
    body = {"model": "sim", "prompt": prompt, "max_tokens": max_tokens, "stream": True}
    async with session.post(url + "/v1/completions", json=body) as resp:
        resp.raise_for_status()
        async for _ in resp.content:
            pass


async def _served(session: aiohttp.ClientSession, url: str) -> list[dict]:
    async with session.get(url + "/sim/requests") as resp:
        return await resp.json()


async def _mode(session: aiohttp.ClientSession, url: str, mode: str, tokens: int,
                count: int, rng: random.Random) -> float:
    """Median server TTFT minus engine TTFT, ms, of ``count`` prompts of ``tokens``."""
    before = len(await _served(session, url))
    decode = None
    if mode == MODES[2]:
        decode = asyncio.create_task(_send(session, url, words(DECODE_PROMPT, rng),
                                           max_tokens=3000))
        await asyncio.sleep(0.3)
    for _ in range(count):
        await _send(session, url, words(tokens, rng))
        await asyncio.sleep(1.0 if mode == MODES[0] else 0.05)
    if decode is not None:
        decode.cancel()
        await asyncio.gather(decode, return_exceptions=True)
    await asyncio.sleep(0.5)
    served = (await _served(session, url))[before:]
    lags = [(r["server_ttft_s"] - r["ttft_s"]) * 1000 for r in served
            if r["server_ttft_s"] is not None and r["prompt_tokens"] > DECODE_PROMPT]
    return statistics.median(lags)


async def measure(url: str, lengths: list[int], count: int) -> list[tuple[int, list[float]]]:
    rng = random.Random(0)
    async with aiohttp.ClientSession() as session:
        return [(n, [await _mode(session, url, mode, n, count, rng) for mode in MODES])
                for n in lengths]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.idle_lag", description=__doc__)
    parser.add_argument("--tokens", default="4000,15000,30000",
                        help="prompt lengths, comma-separated")
    parser.add_argument("--count", type=int, default=8, help="prompts per length and mode")
    parser.add_argument("--profile", default="llama-3-8b@h100-80gb")
    args = parser.parse_args()
    lengths = [int(t) for t in args.tokens.split(",")]
    if min(lengths) <= DECODE_PROMPT:
        parser.error(f"prompts must be longer than the decode's {DECODE_PROMPT} tokens")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "engine_worker.sim", "--port", str(port),
                             "--model", "sim", "--profile", args.profile,
                             "--log-level", "ERROR", "--max-model-len", str(max(lengths) + 4096)])
    try:
        wait_http(url + "/health", proc)
        rows = asyncio.run(measure(url, lengths, args.count))
    finally:
        proc.terminate()
        proc.wait()
    print(f"`python -m bench.idle_lag --tokens {args.tokens} --count {args.count}`\n")
    print("| prompt tokens | " + " | ".join(MODES) + " |")
    print("|---" * (len(MODES) + 1) + "|")
    for n, lags in rows:
        print(f"| {n:,} | " + " | ".join(f"{lag:.1f} ms" for lag in lags) + " |")


if __name__ == "__main__":
    main()
