"""Acceptance 1: two router replicas sharing one Redis send each context to the same worker.

Each question fills more than a block after its unique part, so every request's ring key
(its last full block; the prompt is shorter than the 32-block key window) is its own: the
ring alone scatters a context over the fleet. Only the shared residency makes both
replicas find the worker that is warm. Measured: 100 % with Redis; 71 % for the same
stream through two routers with private in-memory residency (600 requests).

One client: with two or more concurrent clients the bounded-load policy legitimately
spills ~1 % of requests off a busy owner at these tiny loads (bound = 1 or 2), which is
load balancing, not disagreement between replicas.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict

from tests.redis.fleet import Fleet, contexts, rag_body, rag_question, run_stream, wait_until

N_CONTEXTS, N_WORKERS, N_REQUESTS = 100, 4, 2000


async def test_two_routers_agree_on_context_placement(redis_server, fleet: Fleet) -> None:
    sims = [fleet.sim(f"w{i}") for i in range(N_WORKERS)]
    # 100 ms Redis timeout: seven processes share two cores here; a late reply would route
    # on the local view (tested in test_store/test_outage), which is not what this measures
    routers = [fleet.router(name, redis_server.url, sims, redis_timeout_ms=100)
               for name in ("ra", "rb")]
    docs = contexts(N_CONTEXTS, 3000)
    rng = random.Random(1)
    jobs = []
    for i in range(N_REQUESTS):
        ctx = rng.randrange(N_CONTEXTS)
        jobs.append((ctx, routers[i % 2], rag_body(docs[ctx], rag_question(i))))
    results = await run_stream(jobs, concurrency=1)

    assert all(r.status == 200 for r in results), Counter(r.status for r in results)
    per_router = Counter(r.router for r in results)
    assert per_router["ra"] == per_router["rb"] == N_REQUESTS // 2
    by_context: dict[int, Counter[str]] = defaultdict(Counter)
    for r in results:
        by_context[r.context][r.worker] += 1
    agreement = sum(c.most_common(1)[0][1] for c in by_context.values()) / len(results)
    used = Counter(r.worker for r in results)
    print(f"agreement {agreement:.4f}; per worker {dict(used)}; "
          f"reasons {dict(Counter(r.reason for r in results))}")
    # residency is recorded at a try's first byte, on the worker that served it, and
    # flushed to Redis within milliseconds; a request reaching the other replica inside
    # that window routes on the older picture (measured 0.979-1.0 here; private
    # in-memory residency: 0.71)
    assert agreement >= 0.97
    home = {ctx: c.most_common(1)[0][0] for ctx, c in by_context.items()}
    for name in ("ra", "rb"):  # neither replica has a private picture of its own (one
        # would send ~29 % elsewhere, as private in-memory residency does); measured per
        # replica 0.977-0.989 on a loaded machine, from the same flush window as above
        mine = [r for r in results if r.router == name]
        assert sum(r.worker == home[r.context] for r in mine) / len(mine) >= 0.97
    assert len(used) == N_WORKERS  # the contexts are spread, not pinned to one worker
    r = redis_server.client()
    wait_until(lambda: len(r.keys("prefix-router:res:*")) == N_WORKERS, 5, "residency keys")
