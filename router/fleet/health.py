"""Active health checks: a dead worker leaves the candidate set within one interval."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import orjson

from router.fleet.workers import Worker, WorkerPool
from router.infra.metrics import RouterMetrics

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
        """Check every worker; one worker's failure never stops the others' checks."""
        workers = list(self._pool)
        results = await asyncio.gather(*(self.check(w) for w in workers),
                                       return_exceptions=True)
        for worker, result in zip(workers, results, strict=True):
            if isinstance(result, Exception):
                log.error("health check of worker %s failed", worker.id, exc_info=result)

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
        self._pool.set_health(worker, healthy)
        self._metrics.healthy.labels(worker.id).set(1 if healthy else 0)

    async def _learn_models(self, worker: Worker) -> None:
        async with self._session.get(worker.url + "/v1/models", timeout=self._timeout) as resp:
            if resp.status != 200:
                return
            body = await resp.read()
        models = parse_model_ids(body)
        if models is None:  # its /health said yes: keep it, with the models last known
            log.warning("worker %s answered /v1/models with an unexpected body", worker.id)
            return
        if models and models != worker.models:
            worker.models = models


def parse_model_ids(body: bytes) -> frozenset[str] | None:
    """The ids in an OpenAI model listing; None unless it is ``{"data": [...]}``.

    Entries without an id are skipped; a body of any other shape is a worker's bug, and
    must cost that worker its model update, never the health loop."""
    try:
        listing = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(listing, dict) or not isinstance(data := listing.get("data", []), list):
        return None
    return frozenset(str(m["id"]) for m in data
                     if isinstance(m, dict) and isinstance(m.get("id"), str | int))
