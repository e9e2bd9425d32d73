"""Discovery against real Redis: a Redis restart (empty registry) does not empty the pool."""

from __future__ import annotations

import asyncio

from router.config import RouterConfig
from router.infra.redis_client import make_client
from router.protocol import registry
from router.protocol.registry import WorkerRecord
from router.server.app import build_app
from router.server.discovery import Discovery
from router.server.state import ROUTER


async def test_pool_follows_registry_and_survives_an_empty_one(redis_server) -> None:
    state = build_app(RouterConfig(redis_url=redis_server.url, discover=True,
                                   workers=(("static", "http://127.0.0.1:9"),)))[ROUTER]
    client = make_client(redis_server.url)
    discovery = Discovery(state, client)
    record = WorkerRecord(id="r1", url="http://127.0.0.1:8", models=("m",), block_size=16,
                          capacity_blocks=640)
    await registry.publish(client, record, ttl_s=1.5)
    await discovery.poll()
    worker = state.pool.get("r1")
    assert worker is not None and worker.source == "registry" and worker.models == {"m"}
    assert state.residency.local._capacity["r1"] == 160  # type: ignore[attr-defined]

    await registry.set_draining(client, "r1", True)
    await discovery.poll()
    assert worker.draining
    worker.draining = False  # an admin undrain sticks until the registry flag changes again
    await discovery.poll()
    assert not worker.draining

    redis_server.client().flushall()  # as after a restart, before workers heartbeat again
    await discovery.poll()
    assert state.pool.get("r1") is worker  # kept until its announced expiry
    await asyncio.sleep(1.6)
    await discovery.poll()
    assert state.pool.get("r1") is None
    assert state.pool.get("static") is not None  # never touched
    await client.aclose()


async def test_a_heartbeat_keeps_an_operators_drain_flag(redis_server) -> None:  # type: ignore[no-untyped-def]
    client = make_client(redis_server.url)
    record = WorkerRecord(id="hb", url="http://127.0.0.1:1", models=("m",))
    try:
        await registry.publish(client, record, ttl_s=5)
        await registry.set_draining(client, "hb", True)
        await registry.publish(client, record, ttl_s=5)  # the worker's next heartbeat
        (live,) = await registry.read_live(client)
        assert live.draining is True
        await registry.set_draining(client, "hb", False)
        await registry.publish(client, record, ttl_s=5)
        (live,) = await registry.read_live(client)
        assert live.draining is False
    finally:
        await client.aclose()
