"""Acceptance 3 of issue 15: residency survives a router restart.

Each question fills more than a block after its unique part, so every request's ring key
is its own (tests/redis/fleet.py): a router that knows nothing scatters a context over the
fleet, and only residency brings it back to the worker that holds it warm. The workers
(simulated engines) keep running across the restart, as they would in production.
"""

from __future__ import annotations

import signal
from pathlib import Path

from tests.redis.fleet import Fleet, Proc, contexts, rag_body, rag_question, run_stream
from tests.support import stop

N_CONTEXTS, N_WORKERS = 12, 3
# a health check that times out on a busy box would take a warm worker out of the pool
# for a moment, which is not what these tests measure
STEADY = {"health_timeout_s": 5}


async def _homes(router: Proc, docs: list[str], round_: int) -> dict[int, str]:
    """The worker each context lands on, one request per context, one at a time."""
    jobs = [(i, router, rag_body(doc, rag_question(round_ * 100 + i)))
            for i, doc in enumerate(docs)]
    results = await run_stream(jobs, concurrency=1)
    assert all(r.status == 200 for r in results), [r for r in results if r.status != 200]
    return {r.context: r.worker for r in results}


async def _restart_keeps_homes(fleet: Fleet, redis_url: str | None, **settings: object
                               ) -> tuple[list[Proc], dict[int, str]]:
    sims = [fleet.sim(f"w{i}") for i in range(N_WORKERS)]
    docs = contexts(N_CONTEXTS, 3000, seed=11)
    settings = {**STEADY, **settings}
    before = fleet.router("before", redis_url, sims, **settings)
    homes = await _homes(before, docs, 0)
    assert len(set(homes.values())) > 1  # spread over the fleet, not one worker for all
    stop(before.proc, signal.SIGTERM)
    assert before.proc.returncode == 0

    after = fleet.router("after", redis_url, sims, **settings)
    assert await _homes(after, docs, 1) == homes  # the very first request of each context
    return sims, homes


async def test_restart_without_redis_loads_the_snapshot(fleet: Fleet, tmp_path: Path) -> None:
    snapshot = tmp_path / "residency.bin"
    sims, homes = await _restart_keeps_homes(fleet, None, residency_snapshot=snapshot)
    assert snapshot.stat().st_size > 0
    # the same restart without the file scatters the contexts: this test can fail
    cold = fleet.router("cold", None, sims, residency_snapshot=tmp_path / "none.bin", **STEADY)
    assert await _homes(cold, contexts(N_CONTEXTS, 3000, seed=11), 2) != homes


async def test_restart_with_redis_keeps_residency(fleet: Fleet, redis_server) -> None:
    await _restart_keeps_homes(fleet, redis_server.url, redis_timeout_ms=100)
