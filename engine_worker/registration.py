"""Heartbeat registration of a worker in the fleet's Redis (used by the simulator and launcher)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import replace

from router.infra.redis_client import make_client
from router.protocol import registry
from router.protocol.registry import WorkerRecord

log = logging.getLogger(__name__)


class Registration:
    """Keeps one worker's registry entry alive until stopped; survives Redis outages."""

    def __init__(self, redis_url: str, record: WorkerRecord, ttl_s: float = 6.0,
                 prefix: str = registry.DEFAULT_KEY_PREFIX) -> None:
        self._redis = make_client(redis_url, socket_timeout=1.0)  # a cluster or sentinel URL too
        self._record = record
        self._ttl_s = ttl_s
        self._prefix = prefix
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await registry.publish(self._redis, self._record, self._ttl_s, self._prefix)
        self._task = asyncio.create_task(self._heartbeat())

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self._ttl_s / 3)
            try:
                await registry.publish(self._redis, self._record, self._ttl_s, self._prefix)
            except Exception as exc:  # noqa: BLE001 - keep beating through Redis outages
                log.warning("heartbeat to redis failed: %s", exc)

    async def drain(self) -> None:
        """Tell routers to send nothing new; in-flight requests finish normally."""
        self._record = replace(self._record, draining=True)
        await registry.publish(self._redis, self._record, self._ttl_s, self._prefix)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(Exception):
            await registry.remove(self._redis, self._record.id, self._prefix)
        await self._redis.aclose()

