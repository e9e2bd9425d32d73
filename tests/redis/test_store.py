"""RedisResidency against a real redis-server: sharing, LRU capacity, TTL, outage, one EVALSHA."""

from __future__ import annotations

import asyncio
import time
from hashlib import blake2b

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from router.infra.metrics import RouterMetrics
from router.infra.redis_client import make_client
from router.residency.base import ChainShape
from router.residency.redis import RedisResidency
from tests.support import free_port


def chain(name: str, n: int) -> tuple[bytes, ...]:
    links, parent = [], name.encode()
    for i in range(n):
        parent = blake2b(str(i).encode(), digest_size=8, key=parent).digest()
        links.append(parent)
    return tuple(links)


def store(url: str, **kw: object) -> RedisResidency:
    opts = {"key_prefix": "t:", "ttl_s": 60.0, "timeout_ms": 200.0, **kw}
    return RedisResidency(make_client(url), RouterMetrics(), **opts)  # type: ignore[arg-type]


def errors(s: RedisResidency, op: str) -> float:
    return s._metrics.redis_errors.labels(op)._value.get()


async def test_two_stores_share_residency(redis_server) -> None:
    a, b = store(redis_server.url), store(redis_server.url)
    await a.start()
    await b.start()
    c = chain("doc", 20)
    a.record("w1", c)
    await a.flush()
    assert await b.match(c, ["w0", "w1", "w2"]) == {"w1": 20}
    other = (*c[:7], *chain("other", 5))  # shares the first 7 blocks
    assert await b.match(other, ["w1"]) == {"w1": 7}
    assert await b.match(chain("cold", 4), ["w1"]) == {}
    for s in (a, b):
        await s.close()
        await s._redis.aclose()


async def test_capacity_keeps_prefixes_and_keys_expire(redis_server) -> None:
    s = store(redis_server.url, ttl_s=30.0)
    s.set_capacity("w", 10)
    old, new = chain("old", 8), chain("new", 6)
    s.record("w", old)
    await s.flush()
    await asyncio.sleep(0.002)
    s.record("w", new)
    await s.flush()
    r = redis_server.client()
    assert r.zcard("t:res:{w}") == 10
    # the newest chain is whole; the older one lost its tail, not its head
    assert await s.match(new, ["w"]) == {"w": 6}
    s.local.forget("w")  # ask Redis alone
    assert await s.match(old, ["w"]) == {"w": 4}
    assert 0 < r.pttl("t:res:{w}") <= 30_000
    s.forget("w")
    await s.flush()
    assert not r.exists("t:res:{w}")
    await s._redis.aclose()


async def test_capacity_counts_tail_links_by_their_weight(redis_server) -> None:
    """A capacity in head blocks holds fewer long tail links: the shared set keeps as many
    members as the capacity holds at the mix the mirror sees (6 head + 4 tail links of
    weight 4 = 22 units in 10 links), not one member per unit."""
    s = store(redis_server.url, shape=ChainShape(head_blocks=6, tail_weight=4))
    s.set_capacity("w", 44)
    for name in ("a", "b"):  # scores are microseconds minus the index: a few ms apart, the
        s.record("w", chain(name, 10))  # older chain's head is older than the newer's tail
        await s.flush()
        await asyncio.sleep(0.002)
    r = redis_server.client()
    assert r.zcard("t:res:{w}") == 20  # 44 units: both chains whole
    s.record("w", chain("c", 10))
    await s.flush()
    assert r.zcard("t:res:{w}") == 20  # 66 units on a 44-unit worker: 20 links, not 44
    assert await s.match(chain("c", 10), ["w"]) == {"w": 10}
    s.local.forget("w")  # ask Redis alone
    assert await s.match(chain("a", 10), ["w"]) == {}
    await s._redis.aclose()


async def test_match_is_one_evalsha(redis_server) -> None:
    s = store(redis_server.url)
    r = redis_server.client()
    s.record("w1", chain("x", 50))
    await s.flush()
    await s.match(chain("x", 50), ["w0"])  # loads the script once
    r.config_resetstat()
    for i in range(20):
        await s.match(chain(f"q{i % 3}", 50), ["w0", "w1", "w2", "w3"])
    stats = r.info("commandstats")
    assert stats["cmdstat_evalsha"]["calls"] == 20
    called = {k for k in stats if not k.startswith(("cmdstat_config", "cmdstat_info"))}
    assert called <= {"cmdstat_evalsha", "cmdstat_zscore"}  # zscore: inside the script
    await s._redis.aclose()


async def test_outage_falls_back_to_local_and_writes_resume(redis_server) -> None:
    s = store(redis_server.url, timeout_ms=50.0)
    await s.start()
    c = chain("doc", 10)
    s.record("w1", c)
    await s.flush()
    redis_server.kill()
    started = time.monotonic()
    for _ in range(200):  # never raises; the local mirror answers
        assert await s.match(c, ["w1", "w2"]) == {"w1": 10}
    assert time.monotonic() - started < 5
    assert 1 <= errors(s, "match") <= 10, "backoff: a dead Redis is not hit on every request"
    s.record("w2", chain("during", 5))
    redis_server.start()
    deadline = time.monotonic() + 10
    r = redis_server.client()
    while not r.exists("t:res:{w2}") and time.monotonic() < deadline:
        s.record("w2", chain("after", 5))
        await s.match(c, ["w1"])
        await asyncio.sleep(0.1)
    assert r.zcard("t:res:{w2}") >= 5, "writes resume once Redis is back"
    await s.close()
    await s._redis.aclose()


async def test_slow_redis_answers_locally_without_dropping_connections(redis_server) -> None:
    s = store(redis_server.url, timeout_ms=30.0)
    c = chain("doc", 6)
    s.record("w1", c)
    await s.flush()
    assert await s.match(c, ["w1"]) == {"w1": 6}
    redis_server.client().execute_command("CLIENT", "PAUSE", "400", "ALL")
    started = time.monotonic()
    assert await s.match(c, ["w1"]) == {"w1": 6}  # from the local mirror, on time
    assert time.monotonic() - started < 0.3
    assert errors(s, "match_timeout") == 1
    assert not s.backoff.down  # one late reply is not an outage
    await asyncio.sleep(0.5)
    assert await s.match(c, ["w1"]) == {"w1": 6}
    assert errors(s, "match") == 0  # the late reply landed; nothing was cut mid-read
    await s._redis.aclose()


async def test_records_lost_to_a_full_queue_are_counted() -> None:
    s = store(f"redis://127.0.0.1:{free_port()}", max_pending=4)  # nothing listens there
    for i in range(6):
        s.record("w", chain(f"c{i}", 3))  # the first two fall off the full queue
    with pytest.raises(RedisConnectionError):
        await s.flush()  # Redis is away: the four go back to the queue, none lost
    assert len(s._pending) == 4
    assert b"prefix_router_residency_dropped_records_total 2.0" in s._metrics.render()
    await s._redis.aclose()
