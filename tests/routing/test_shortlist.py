"""A large fleet's shortlist decides as the whole fleet would where it matters: the warm
holder, the ring owner, the bounded-load guard; and the pool's views and load total follow
every change."""

from __future__ import annotations

import asyncio
import math
import random

from router.fleet.workers import Worker, WorkerPool
from router.infra.metrics import RouterMetrics
from router.residency.memory import MemoryResidency
from router.routing.keys import prompt_key
from router.routing.pipeline import Pipeline
from router.routing.policies import make_policy
from router.routing.policies.base import Decision

N = 150  # over the shortlist's default size (64)


def fleet_of(loads: list[int]) -> WorkerPool:
    pool = WorkerPool()
    for i, load in enumerate(loads):
        pool.add(Worker(id=f"w{i}", url=f"http://w{i}", in_flight=load, healthy=True))
    return pool


def pipeline(pool: WorkerPool, residency: MemoryResidency, shortlist_size: int) -> Pipeline:
    return Pipeline(pool, make_policy("predicted_ttft"), residency, RouterMetrics(),
                    block_chars=64, max_blocks=64, key_blocks=8,
                    shortlist_size=shortlist_size)


async def decide(p: Pipeline, prompt: bytes) -> tuple[Decision, int]:
    fleet = p.fleet(None)
    request = await p.key({}, "m", False, lambda _: prompt, None, fleet)
    candidates = await p.candidates(request, fleet)
    await p.annotate(request, candidates)
    return p.rank(request, candidates), len(candidates)


def prompts(rng: random.Random, n: int) -> list[bytes]:
    return [rng.randbytes(400).hex().encode() for _ in range(n)]


def test_equal_loads_shortlist_decides_as_the_whole_fleet() -> None:
    async def run() -> None:
        rng = random.Random(1)
        warm, cold = prompts(rng, 40), prompts(rng, 40)
        residency = MemoryResidency()
        for i, prompt in enumerate(warm):
            residency.record(f"w{(7 * i) % N}",
                             prompt_key(prompt, "m", 64, 64, 8).chain)
        await asyncio.sleep(0)
        short = pipeline(fleet_of([2] * N), residency, shortlist_size=16)
        whole = pipeline(fleet_of([2] * N), residency, shortlist_size=10_000)
        for prompt in warm + cold:
            (a, seen), (b, everyone) = await decide(short, prompt), await decide(whole, prompt)
            assert a.ranked[0].id == b.ranked[0].id
            assert (a.reason, a.ranked[0].matched_blocks) == (b.reason, b.ranked[0].matched_blocks)
            assert seen < everyone == N  # the shortlist weighed fewer

    asyncio.run(run())


def test_never_over_the_fleet_bound_and_warm_holders_are_weighed() -> None:
    async def run() -> None:
        rng = random.Random(2)
        loads = [rng.choice([0, 1, 2, 8, 30]) for _ in range(N)]
        pool = fleet_of(loads)
        residency = MemoryResidency()
        warm = prompts(rng, 30)
        holder = {}
        for prompt in warm:
            holder[prompt] = f"w{rng.randrange(N)}"
            residency.record(holder[prompt], prompt_key(prompt, "m", 64, 64, 8).chain)
        await asyncio.sleep(0)
        p = pipeline(pool, residency, shortlist_size=16)
        bound = math.ceil(1.25 * (sum(loads) + 1) / N) + 4
        for prompt in warm + prompts(rng, 30):
            fleet = p.fleet(None)
            request = await p.key({}, "m", False, lambda _, x=prompt: x, None, fleet)
            candidates = await p.candidates(request, fleet)
            assert len(candidates) < N
            if prompt in holder:  # the worker holding the prompt is always weighed
                assert holder[prompt] in {c.id for c in candidates}
            await p.annotate(request, candidates)
            chosen = p.rank(request, candidates).ranked[0]
            assert chosen.load + 1 <= bound
            if prompt in holder and pool.get(holder[prompt]).load + 1 <= bound:  # type: ignore[union-attr]
                assert chosen.matched_blocks > 0  # an eligible warm worker wins over cold ones

    asyncio.run(run())


def test_pool_load_total_follows_every_change() -> None:
    pool = fleet_of([3, 0, 5])
    a, b, c = (pool.get(f"w{i}") for i in range(3))
    assert a and b and c
    assert pool.view(None).load() == 8
    a.begin()
    b.begin()
    c.finish()
    b.set_external_load(4)
    assert pool.view(None).load() == 3 + 1 + 1 + 4 + 5 - 1
    pool.remove("w0")
    assert pool.view(None).load() == 1 + 4 + 4
    a.begin()  # a removed worker no longer counts
    assert pool.view(None).load() == 9


def test_views_follow_health_draining_and_models() -> None:
    pool = fleet_of([0, 0, 0])
    w0, w1 = pool.get("w0"), pool.get("w1")
    assert w0 and w1
    assert len(pool.view(None)) == 3
    pool.set_health(w0, False, answered=True)
    w1.set_serving(draining=True)
    assert [w.id for w in pool.view(None).workers] == ["w2"]
    w1.set_serving(draining=False, models=frozenset({"m"}))
    assert [w.id for w in pool.view("m").workers] == ["w1", "w2"]  # w2's models are not known yet
    assert [w.id for w in pool.view("other").workers] == ["w2"]
