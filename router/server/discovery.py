"""Registry -> pool: routers learn workers from the heartbeats workers keep in Redis.

Every ``registry_poll_s`` the router reads the live registry (router/protocol/registry.py's schema)
and reconciles its pool: new workers join (source "registry", health-checked at once so
they take traffic within one poll), workers whose heartbeat lapsed leave, draining is
mirrored, KV capacity becomes the residency store's per-worker cap.

Why removal goes by the last heartbeat expiry this router saw, not by absence from one
read: a Redis restart (or failover to an empty replica) empties the registry for up to a
heartbeat period; removing every worker then would turn a Redis blip into a fleet-wide
outage. A worker leaves when now > the expiry it last announced, which is within its TTL
of dying whether its entry lapsed or vanished; meanwhile health checks keep a dead one
out of rotation. A failed read changes nothing (the pool keeps its last known shape).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

from aiohttp import web
from redis.asyncio import Redis

from router.fleet.workers import Worker
from router.infra.redis_client import timed
from router.infra.supervisor import SUPERVISOR
from router.protocol import registry
from router.protocol.registry import WorkerRecord
from router.server.precise_ctx import record_feed_params
from router.server.state import ROUTER, RouterState

log = logging.getLogger(__name__)

async def read_registry(redis: Redis, prefix: str) -> list[tuple[WorkerRecord, float]]:
    """Live records with the expiry (unix s) of their heartbeat; two round trips."""
    now = time.time()
    entries = await redis.zrangebyscore(registry.workers_key(prefix), now, "+inf",
                                        withscores=True)
    if not entries:
        return []
    async with redis.pipeline(transaction=False) as pipe:
        for worker_id, _ in entries:
            pipe.hgetall(registry.worker_key(prefix, worker_id.decode()))
        raws = await pipe.execute()
    return [(WorkerRecord.from_hash(raw), float(expiry))
            for raw, (_, expiry) in zip(raws, entries, strict=True) if raw]


def _fingerprint(record: WorkerRecord) -> str:
    return str(record.extra.get(registry.API_KEY_FINGERPRINT) or "")


class Discovery:
    """Keeps the registry-sourced part of one router's pool in step with Redis."""

    def __init__(self, state: RouterState, redis: Redis) -> None:
        self._state = state
        self._redis = redis
        self._expiry: dict[str, float] = {}  # worker id -> last announced heartbeat expiry
        self._draining: dict[str, bool] = {}  # last registry value (admin drains stick)

    async def run(self) -> None:
        while True:
            await self.poll()
            await asyncio.sleep(self._state.config.registry_poll_s)

    async def poll(self) -> None:
        cfg = self._state.config
        try:
            live = await timed(self._state.metrics, "registry",
                               read_registry(self._redis, cfg.redis_key_prefix))
        except Exception as exc:  # noqa: BLE001 - keep the last known pool through outages
            log.debug("registry read failed: %r", exc)
            self._expire()
            return
        for record, expiry in live:
            self._expiry[record.id] = expiry
            try:  # one worker's odd record or failing first check must not stall the rest
                await self._upsert(record)
            except Exception:
                log.exception("registry record of worker %s not applied", record.id)
        self._expire()

    async def _upsert(self, record: WorkerRecord) -> None:
        state = self._state
        pool = state.pool
        existing = pool.get(record.id)
        if existing is not None and existing.source != "registry":
            return  # a statically configured or admin-added worker of that id wins
        url = record.url.rstrip("/")
        feed = record_feed_params(record) if state.precise is not None else None
        if existing is None or existing.url != url or existing.kv_events != feed:
            # new, or a restarted engine (new address or feed): pool.add replaces the old
            # one through the pool's hooks, so its cold cache starts from nothing
            worker = state.new_worker(record.id, url, "registry", frozenset(record.models),
                                      _fingerprint(record))
            worker.draining = record.draining
            worker.kv_events = feed
            self._apply_capacity(worker, record)
            pool.add(worker)
            self._draining[record.id] = record.draining
            log.info("worker %s joined from the registry at %s", record.id, url)
            if state.health is not None:
                await state.health.check(worker)
            return
        if record.models and frozenset(record.models) != existing.models:
            existing.set_serving(models=frozenset(record.models))
        if (fingerprint := _fingerprint(record)) != existing.key_fingerprint:
            # the engine restarted with another key at the same address: present that one
            existing.key_fingerprint = fingerprint
            existing.api_key = state.upstream_keys.for_worker(existing.id, existing.url,
                                                              fingerprint)
        if self._draining.get(record.id) != record.draining:
            existing.set_serving(draining=record.draining)
            self._draining[record.id] = record.draining
        if record.capacity_blocks != existing.capacity_blocks:
            self._apply_capacity(existing, record)

    def _apply_capacity(self, worker: Worker, record: WorkerRecord) -> None:
        self._state.apply_capacity(worker, record.capacity_blocks, record.block_size)

    def _expire(self) -> None:
        now = time.time()
        for worker_id, expiry in list(self._expiry.items()):
            if now <= expiry:
                continue
            del self._expiry[worker_id]
            self._draining.pop(worker_id, None)
            worker = self._state.pool.get(worker_id)
            if worker is None or worker.source != "registry":
                continue
            self._state.pool.remove(worker_id)  # hooks: router/server/pool_hooks.py
            log.info("worker %s left: its registry heartbeat lapsed", worker_id)


async def discovery_ctx(app: web.Application) -> AsyncIterator[None]:
    """Poll the registry when ``discover`` is set and Redis is configured."""
    state = app[ROUTER]
    if not state.config.discover or state.redis is None:
        yield
        return
    discovery = Discovery(state, state.redis)
    await discovery.poll()  # start with the fleet we can see
    app[SUPERVISOR].start("discovery", discovery.run)
    yield
    await app[SUPERVISOR].stop("discovery")
