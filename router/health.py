"""Active health checks: a dead worker leaves the candidate set within one interval."""

from __future__ import annotations

import asyncio
import logging

import aiohttp

from router.metrics import RouterMetrics
from router.workers import Worker, WorkerPool

log = logging.getLogger(__name__)


class HealthChecker:
    """Polls each worker's /health, and /v1/models to learn which models it serves."""

    def __init__(self, pool: WorkerPool, session: aiohttp.ClientSession, metrics: RouterMetrics,
                 interval_s: float, timeout_s: float) -> None:
        self._pool = pool
        self._session = session
        self._metrics = metrics
        self._interval_s = interval_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def run(self) -> None:
        while True:
            await self.check_all()
            await asyncio.sleep(self._interval_s)

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check(w) for w in self._pool))

    async def check(self, worker: Worker) -> None:
        try:
            async with self._session.get(worker.url + "/health", timeout=self._timeout) as resp:
                healthy = resp.status == 200
            if healthy:
                await self._learn_models(worker)
        except (aiohttp.ClientError, TimeoutError):
            healthy = False
        if healthy != worker.healthy:
            log.info("worker %s is %s", worker.id, "healthy" if healthy else "unhealthy")
            if healthy:
                worker.breaker.on_success()
        worker.healthy = healthy
        self._metrics.healthy.labels(worker.id).set(1 if healthy else 0)

    async def _learn_models(self, worker: Worker) -> None:
        async with self._session.get(worker.url + "/v1/models", timeout=self._timeout) as resp:
            if resp.status != 200:
                return
            listing = await resp.json(content_type=None)
        models = frozenset(str(m["id"]) for m in listing.get("data", []) if "id" in m)
        if models and models != worker.models:
            worker.models = models
