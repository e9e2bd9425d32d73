"""Acceptance 4: the decision path reads Redis once per routed request (one EVALSHA).

Background traffic is kept out of the count: no discovery, the load exchange ticks only at
start (long period), no engine scrapes (those are HTTP anyway). What remains is the
request path's read (EVALSHA; its ZSCOREs run inside the script, on the server) and the
batched residency writes.
"""

from __future__ import annotations

from tests.redis.fleet import Fleet, contexts, rag_body, run_stream

N = 60
READS_IN_SCRIPT = {"zscore"}
CONNECTION_SETUP = {"hello", "client|setinfo", "select", "auth"}  # once per new connection
BATCHED_WRITES = {"zadd", "zremrangebyscore", "zremrangebyrank", "pexpire", "del"}


async def test_one_read_round_trip_per_routed_request(redis_server, fleet: Fleet) -> None:
    sims = [fleet.sim(f"w{i}") for i in range(3)]
    # a generous timeout: this test counts commands, not the box's scheduling latency
    router = fleet.router("ra", redis_server.url, sims, load_publish_s=3600,
                          scrape_interval_s=0, redis_timeout_ms=250)
    docs = contexts(10, 2000, seed=9)
    warmup = [(0, router, rag_body(docs[0], "warm-up"))]
    await run_stream(warmup, concurrency=1)  # loads the script (EVAL once after NOSCRIPT)
    client = redis_server.client()
    client.config_resetstat()
    jobs = [(i % 10, router, rag_body(docs[i % 10], f"q{i}")) for i in range(N)]
    results = await run_stream(jobs, concurrency=4)
    assert all(r.status == 200 for r in results)
    stats = client.info("commandstats")
    calls = {k.removeprefix("cmdstat_"): v["calls"] for k, v in stats.items()
             if not k.startswith(("cmdstat_config", "cmdstat_info"))}
    print(f"commands for {N} routed requests: {calls}")
    # at most one read round trip per decision; fewer only when a call timed out on this
    # busy box and the store skipped Redis for its backoff window (answering locally)
    assert N // 2 <= calls.get("evalsha", 0) <= N
    assert "eval" not in calls
    assert set(calls) <= {"evalsha"} | READS_IN_SCRIPT | BATCHED_WRITES | CONNECTION_SETUP
    assert calls.get("zadd", 0) <= N  # writes are coalesced per worker per flush
