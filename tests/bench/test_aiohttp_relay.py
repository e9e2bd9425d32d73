"""bench.aiohttp_relay, the overhead bench's floor row: it must relay what a router would,
a whole body whole and a stream as it comes, or its CPU figure measures something else."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import aiohttp
import orjson

from bench import fleet


def test_relays_bodies_and_streams(tmp_path: Path) -> None:
    port = fleet.free_port()
    upstream = fleet.launch("upstream", [sys.executable, "-m", "bench.upstream", str(port)],
                            f"http://127.0.0.1:{port}", tmp_path)
    relay_port = fleet.free_port()
    try:
        relay = fleet.launch("relay", [sys.executable, "-m", "bench.aiohttp_relay",
                                       str(relay_port), upstream.url],
                             f"http://127.0.0.1:{relay_port}", tmp_path, ready_path="/ready")
        try:
            whole, chunks = asyncio.run(_ask(relay.url))
        finally:
            relay.stop()
    finally:
        upstream.stop()
    assert orjson.loads(whole)["usage"]["completion_tokens"] == 16
    events = b"".join(chunks).split(b"\n\n")
    assert events[-2] == b"data: [DONE]" and len(events) == 18  # 16 tokens, [DONE], ""


async def _ask(url: str) -> tuple[bytes, list[bytes]]:
    async with aiohttp.ClientSession() as session:
        body = {"model": "bench-model", "prompt": "hello", "max_tokens": 16}
        async with session.post(url + "/v1/completions", json=body) as resp:
            assert resp.status == 200
            whole = await resp.read()
        async with session.post(url + "/v1/completions", json={**body, "stream": True}) as resp:
            assert resp.status == 200 and resp.content_type == "text/event-stream"
            chunks = [chunk async for chunk in resp.content.iter_any()]
    return whole, chunks
