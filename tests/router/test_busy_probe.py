"""A worker whose /health answers late while it streams is busy, not dead.

Since a worker marked down has its waiting requests moved and its streams resumed, a
probe that times out only because the engine's event loop is busy streaming must not mark
it down: under a burst that would cancel requests fleet-wide. Bytes flowing on its
requests during the probe's wait prove it alive; once nothing flows, a late probe marks it
down as before.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from tests.router.conftest import MODEL, Fleet

STREAM = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "hi"}]}


async def healthy_gauge(session: aiohttp.ClientSession, fleet: Fleet, worker: str) -> float:
    async with session.get(fleet.url + "/metrics") as resp:
        text = await resp.text()
    line = next(r for r in text.splitlines()
                if r.startswith("prefix_router_worker_healthy{") and f'"{worker}"' in r)
    return float(line.split()[-1])


@pytest.mark.router_args("--health-timeout-s", "0.3")
async def test_a_late_probe_on_a_streaming_worker_keeps_it_up_and_its_stream_whole(
        fleet: Fleet) -> None:
    headers = {"X-Test-Mode": "slow-stream", "X-Test-Events": "150"}  # 3 s, an event / 20 ms
    async with aiohttp.ClientSession() as session:
        async with session.post(fleet.url + "/v1/chat/completions", json=STREAM,
                                headers=headers) as resp:
            worker = resp.headers["X-Prefix-Router-Worker"]
            assert resp.headers["X-Prefix-Router-Reason"] != "failover"
            fleet.by_name(worker).post("/health-delay/1000")  # every probe now times out
            body, seen = b"", []
            while body.count(b"data: ") < 100:  # 2 s in: several probes have timed out
                body += await resp.content.readuntil(b"\n\n")
                if body.count(b"data: ") % 10 == 0:
                    seen.append(await healthy_gauge(session, fleet, worker))
            body += await resp.content.read()
        assert body.endswith(b"data: [DONE]\n\n") and b'"error"' not in body
        assert body.count(b"data: ") == 151  # every event from the one worker, no resume
        assert seen and set(seen) == {1.0}, "a streaming worker was marked down for a late probe"
        assert fleet.by_name(worker).stats()["cancelled"] == 0
        # idle now: the same late probe is a verdict, and the worker goes down
        deadline = time.monotonic() + 10
        while await healthy_gauge(session, fleet, worker) != 0.0:
            assert time.monotonic() < deadline, "an idle worker with a dead probe stayed up"
            await asyncio.sleep(0.1)


@pytest.mark.router_args("--health-timeout-s", "0.3", "--prefill-rate", "2000")
async def test_a_late_probe_on_a_worker_computing_a_long_prompt_keeps_it_up(
        fleet: Fleet) -> None:
    """Nothing streams while an engine computes a long prompt: its probe times out, yet the
    prompt queued on it (~7,500 tokens at 2,000 tokens/s: ~4 s predicted) says it is busy.
    Marked down, its request would move to a worker that must compute it again."""
    long = {"model": MODEL, "messages": [{"role": "user", "content": "word " * 6000}]}
    async with aiohttp.ClientSession() as session:
        call = asyncio.create_task(session.post(
            fleet.url + "/v1/chat/completions", json=long,
            headers={"X-Test-Mode": "sleep-2500"}))  # its first byte 2.5 s away
        await asyncio.sleep(0.3)
        for upstream in fleet.upstreams:  # every probe now times out
            upstream.post("/health-delay/1000")
        async with await call as resp:
            assert resp.status == 200, await resp.text()
            worker = resp.headers["X-Prefix-Router-Worker"]
            assert resp.headers["X-Prefix-Router-Reason"] != "failover"
        stats = {u.name: u.stats() for u in fleet.upstreams}
        assert stats[worker]["cancelled"] == 0
        assert sum(s["requests"] for s in stats.values()) == 1  # served once, where it waited
        # idle now: the late probe is a verdict, and the worker goes down
        deadline = time.monotonic() + 10
        while await healthy_gauge(session, fleet, worker) != 0.0:
            assert time.monotonic() < deadline, "an idle worker with a dead probe stayed up"
            await asyncio.sleep(0.1)
