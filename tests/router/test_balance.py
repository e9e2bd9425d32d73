"""Warm affinity, spill under the bound, and balance over real HTTP (prefix_aware:
router/routing/policies/prefix_aware.py)."""

from __future__ import annotations

import asyncio
import math
import random
from collections import Counter

import aiohttp
import pytest

from tests.router.conftest import MODEL, start_router, start_upstreams
from tests.support import stop

SYSTEM = "You answer questions about the retrieved documents. Cite the document. " * 4


def document(i: int) -> str:
    rng = random.Random(i)
    words = [f"{rng.choice('bcdfghjklmnpqrstvwz')}{rng.choice('aeiou')}{rng.randrange(99)}"
             for _ in range(900)]
    return f"Document {i}: " + " ".join(words)  # ~5,000 characters


def chat(i: int, question: str) -> dict:
    return {"model": MODEL, "max_tokens": 8, "messages": [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": document(i) + "\n\nQuestion: " + question}]}


@pytest.fixture(params=["prefix_aware"])
def four_workers(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    ups = start_upstreams(4)
    port, router = start_router([u.url for u in ups], "--policy", request.param,
                                "--bound-margin", "0")
    yield f"http://127.0.0.1:{port}", ups
    for p in [router, *(u.proc for u in ups)]:
        stop(p)


async def test_a_context_stays_warm_then_spills_and_the_spill_is_warm_too(
        four_workers) -> None:  # type: ignore[no-untyped-def]
    base, _ = four_workers
    url = base + "/v1/chat/completions"
    async with aiohttp.ClientSession() as s:
        seen = []
        for q in range(5):
            async with s.post(url, json=chat(7, f"question {q}?")) as r:
                assert r.status == 200
                seen.append((r.headers["X-Prefix-Router-Worker"],
                             r.headers["X-Prefix-Router-Reason"]))
        owner = seen[0][0]
        assert seen[0][1] == "ring"
        assert seen[1:] == [(owner, "warm")] * 4

        # keep the owner busy: it is now at the bound, so the context spills ...
        hang = asyncio.create_task(s.post(url, json=chat(7, "slow one"),
                                          headers={"X-Test-Mode": "hang"}))
        await asyncio.sleep(0.3)
        async with s.post(url, json=chat(7, "while busy")) as r:
            second, reason = r.headers["X-Prefix-Router-Worker"], r.headers[
                "X-Prefix-Router-Reason"]
        assert second != owner and reason == "spill"
        # ... and the spilled-to worker now counts as warm for that context
        async with s.post(url, json=chat(7, "again while busy")) as r:
            assert r.headers["X-Prefix-Router-Worker"] == second
            assert r.headers["X-Prefix-Router-Reason"] == "warm"
        hang.cancel()


@pytest.mark.parametrize("four_workers", ["prefix_aware", "predicted_ttft"], indirect=True)
async def test_balance_and_bound_with_200_contexts_4_workers_16_clients(
        four_workers) -> None:  # type: ignore[no-untyped-def]
    base, ups = four_workers
    url = base + "/v1/chat/completions"
    rng = random.Random(3)
    jobs = [rng.randrange(200) for _ in range(800)]
    routed: Counter[str] = Counter()
    reasons: Counter[str] = Counter()

    async def client(session: aiohttp.ClientSession, queue: asyncio.Queue[int]) -> None:
        while not queue.empty():
            ctx = queue.get_nowait()
            async with session.post(url, json=chat(ctx, f"q{rng.random()}"),
                                    headers={"X-Test-Mode": "sleep-20"}) as r:
                assert r.status == 200
                routed[r.headers["X-Prefix-Router-Worker"]] += 1
                reasons[r.headers["X-Prefix-Router-Reason"]] += 1

    queue: asyncio.Queue[int] = asyncio.Queue()
    for job in jobs:
        queue.put_nowait(job)
    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(client(session, queue) for _ in range(16)))

    assert sum(routed.values()) == len(jobs) and len(routed) == 4
    mean = len(jobs) / 4
    assert max(routed.values()) / mean <= 1.35, routed
    # with at most 16 in flight, bound = ceil(1.25 * 16 / 4): no upstream ever saw more
    bound = math.ceil(1.25 * 16 / 4)
    assert max(u.stats()["max_in_flight"] for u in ups) <= bound
    # affinity survives the bound: most repeats of a context found it warm
    repeats = len(jobs) - len(set(jobs))
    assert reasons["warm"] + reasons["home"] >= 0.6 * repeats, reasons
