"""Acceptance 3: a Redis outage during load costs clients nothing; writes resume after it."""

from __future__ import annotations

import asyncio
import random
import urllib.request
from collections import Counter

from prometheus_client.parser import text_string_to_metric_families

from tests.redis.fleet import Fleet, contexts, rag_body, run_stream, wait_until

N_REQUESTS = 800


def redis_errors(url: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=2) as resp:
        text = resp.read().decode()
    return sum(s.value for f in text_string_to_metric_families(text)
               if f.name == "prefix_router_redis_errors" for s in f.samples
               if s.name.endswith("_total"))


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/ready", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


async def test_redis_outage_is_invisible_to_clients(redis_server, fleet: Fleet) -> None:
    sims = [fleet.sim(f"w{i}") for i in range(3)]
    router = fleet.router("ra", redis_server.url, sims)
    docs = contexts(40, 2000, seed=5)
    rng = random.Random(2)
    picks = [rng.randrange(len(docs)) for _ in range(N_REQUESTS)]
    jobs = [(c, router, rag_body(docs[c], f"q{i}")) for i, c in enumerate(picks)]
    client = redis_server.client()
    events: dict[str, int] = {}
    ready_during_outage: list[bool] = []

    def on_done(done: int) -> None:
        if done == N_REQUESTS // 4 and "killed" not in events:
            events["killed"] = done
            redis_server.kill()
        elif done == N_REQUESTS // 2 and "restarted" not in events:
            ready_during_outage.append(ready(router.url))
            events["restarted"] = done
            redis_server.start()  # empty: no persistence, so any res: key is a new write

    results = await run_stream(jobs, concurrency=4, on_done=on_done)
    assert events.keys() == {"killed", "restarted"}
    assert Counter(r.status for r in results) == Counter({200: N_REQUESTS})
    assert ready_during_outage == [True]
    assert redis_errors(router.url) > 0  # the outage was seen, counted, and absorbed

    # the same router process writes residency again once Redis is back
    more = [(c, router, rag_body(docs[c], "again")) for c in range(len(docs))]

    def resumed() -> bool:
        asyncio.run(run_stream(more[:8], concurrency=2))
        return len(client.keys("prefix-router:res:*")) > 0

    took = await asyncio.to_thread(wait_until, resumed, 15, "residency writes after restart")
    print(f"residency writes seen {took:.2f}s after the load run; {dict(events)}")
