"""Acceptance 4 of issue 15, Sentinel: a master, a replica and three sentinels, all real
redis-server processes, with a forced failover (SENTINEL FAILOVER) while the router works.

The router's client asks the sentinels for the master and asks again when a connection
fails (the demoted master answers READONLY, or drops its clients): the calls in flight at
that moment fail over to the residency store's local view, nothing reaches a client, and
the writes after it land on the promoted master.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Iterator

import aiohttp
import pytest
import redis

from router.infra.metrics import RouterMetrics
from router.infra.redis_client import make_client
from router.residency.redis import RedisResidency
from tests.redis.fleet import (
    Fleet,
    Proc,
    contexts,
    rag_body,
    rag_question,
    run_stream,
    wait_until,
)
from tests.redis.test_store import chain
from tests.redis.topologies import Sentinels, start_sentinels

WORKERS = ["w0", "w1", "w2"]


@pytest.fixture(scope="module")
def sentinels() -> Iterator[Sentinels]:
    topology = start_sentinels(3)
    yield topology
    topology.close()


def _store(url: str) -> RedisResidency:
    return RedisResidency(make_client(url), RouterMetrics(), key_prefix="t:", ttl_s=60.0,
                          timeout_ms=500.0)


async def _eventually_matches(store: RedisResidency, c: tuple[bytes, ...], worker: str) -> None:
    for _ in range(100):  # the first calls after a failover may find the demoted master
        if (await store.match(c, WORKERS)).get(worker) == len(c) and not store.backoff.down:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{worker} never matched through the sentinels")


async def _client(router: Proc, docs: list[str], statuses: list[int],
                  stop: asyncio.Event) -> None:
    """Requests one after another until ``stop``; every status is kept."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        while not stop.is_set():
            i = len(statuses)
            body = rag_body(docs[i % len(docs)], rag_question(i))
            async with session.post(router.url + "/v1/chat/completions", json=body) as resp:
                await resp.read()
                statuses.append(resp.status)


async def _until(predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 30
    while not predicate():
        assert time.monotonic() < deadline, "requests stalled"
        await asyncio.sleep(0.02)


async def _flush_through(store: RedisResidency) -> None:
    for _ in range(100):  # a flush that meets the demoted master is re-queued, then retried
        try:
            await store.flush()
            return
        except redis.RedisError:
            await asyncio.sleep(0.1)
    raise AssertionError("residency never flushed through the sentinels")


async def test_a_failover_mid_run_loses_no_request_and_no_residency(sentinels: Sentinels
                                                                    ) -> None:
    fleet = Fleet()
    writer = _store(sentinels.url)  # an in-process store beside the router, for exact checks
    try:
        sims = [fleet.sim(w) for w in WORKERS]
        router = fleet.router("r", sentinels.url, sims, redis_timeout_ms=200)
        before, after = chain("before", 6), chain("after", 4)
        writer.record("w1", before)
        await writer.flush()
        statuses: list[int] = []
        stop = asyncio.Event()
        clients = [asyncio.create_task(_client(router, contexts(10, 2000, seed=9), statuses,
                                               stop)) for _ in range(2)]
        await _until(lambda: len(statuses) >= 20)
        old = sentinels.master_port_now()
        # requests keep flowing through the failover (~10 s: sentinel demotes the old
        # master on its next INFO round, and only then do the router's writes fail over)
        new = await asyncio.to_thread(sentinels.failover)
        assert new != old
        at_failover = len(statuses)
        await _until(lambda: len(statuses) >= at_failover + 20)
        stop.set()
        await asyncio.gather(*clients)
        assert Counter(statuses) == {200: len(statuses)}

        promoted = redis.Redis(host="127.0.0.1", port=new)
        writer.record("w2", after)
        await _flush_through(writer)
        assert promoted.zcard("t:res:{w2}") == len(after)  # written to the new master
        assert promoted.zcard("t:res:{w1}") == len(before)  # replicated before the failover
        reader = _store(sentinels.url)  # a router started now finds both
        await _eventually_matches(reader, before, "w1")
        await _eventually_matches(reader, after, "w2")
        await reader._redis.aclose()

        # and the router itself writes its new placements to the promoted master: a new
        # context adds its blocks there
        def members() -> int:
            return sum(promoted.zcard(k) for k in promoted.keys("prefix-router:res:*"))

        await asyncio.sleep(0.3)  # the router's last batch (every 50 ms) has landed
        settled = members()
        marker = [(0, router, rag_body("after the failover " * 200, rag_question(999)))]
        assert (await run_stream(marker, concurrency=1))[0].status == 200
        wait_until(lambda: members() > settled, 5, "the router's residency on the new master")
    finally:
        await writer._redis.aclose()
        fleet.close()
