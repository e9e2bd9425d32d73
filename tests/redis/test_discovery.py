"""Acceptance 2: workers found by heartbeat, dropped when it lapses, skipped while draining."""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter

from tests.redis.fleet import Fleet, admin_workers, contexts, rag_body, run_stream, wait_until


async def test_registry_join_drain_and_lapse(redis_server, fleet: Fleet) -> None:
    routers = [fleet.router(name, redis_server.url, discover="true") for name in ("ra", "rb")]

    def visible(worker_id: str, healthy: bool = True) -> bool:
        views = [admin_workers(r).get(worker_id) for r in routers]
        return all(v is not None and (v["healthy"] or not healthy) for v in views)

    sims = {}
    for name, scale in (("sa", 0.001), ("sb", 0.001), ("sd", 1.0)):  # sd: ~8 ms per token
        sims[name] = fleet.sim(name, redis_server.url, time_scale=scale)
        took = wait_until(lambda n=name: visible(n), 5, f"{name} in every router's pool")
        print(f"{name} routable on both routers {took:.2f}s after it answered /health")
    view = admin_workers(routers[0])["sd"]
    assert view["source"] == "registry" and view["capacity_blocks"] > 0

    # drain: requests already on sd finish; no new request reaches it
    docs = contexts(60, 1500, seed=3)
    first = [(i, routers[i % 2], rag_body(docs[i], "q", max_tokens=400)) for i in range(24)]
    in_flight = asyncio.create_task(run_stream(first, concurrency=24))
    await asyncio.to_thread(wait_until, lambda: any(
        admin_workers(r)["sd"]["in_flight"] > 0 for r in routers), 5, "a request on sd")
    sims["sd"].proc.send_signal(signal.SIGTERM)  # the sim flags itself draining, then drains
    drained_at = time.monotonic()
    await asyncio.to_thread(wait_until, lambda: all(
        admin_workers(r)["sd"]["draining"] for r in routers), 5, "sd draining everywhere")
    later = [(i, routers[i % 2], rag_body(docs[i], "q2")) for i in range(24, 60)]
    after = await run_stream(later, concurrency=6)
    assert all(r.status == 200 for r in after), Counter(r.status for r in after)
    assert not any(r.worker == "sd" for r in after)
    before = await in_flight
    assert all(r.status == 200 for r in before), Counter((r.status, r.worker) for r in before)
    finished_on_sd = sum(r.worker == "sd" for r in before)
    assert finished_on_sd > 0 and time.monotonic() - drained_at < 10

    # lapse: a SIGKILLed worker leaves every pool within its heartbeat TTL (6 s) + one poll
    sims["sb"].proc.kill()
    took = await asyncio.to_thread(wait_until, lambda: all(
        "sb" not in admin_workers(r) for r in routers), 6 + 1.5, "sb gone after SIGKILL")
    print(f"sb left both routers {took:.2f}s after SIGKILL; {finished_on_sd} drained on sd")
    assert "sa" in admin_workers(routers[0])
