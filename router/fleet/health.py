"""Active health checks: a dead worker leaves the candidate set within one interval; a
busy one whose probe is late but whose streams flow stays in it."""

from __future__ import annotations

import asyncio
import logging
import time

import aiohttp
import orjson

from router.fleet.workers import LoraAdapter, Worker, WorkerPool
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
        self._timeout_s = timeout_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._tls_failed: set[str] = set()  # workers whose TLS failure was logged

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
        answered = False
        try:
            async with self._session.get(worker.url + "/health", headers=worker.auth_headers(),
                                         timeout=self._timeout) as resp:
                healthy, answered = resp.status == 200, True
            if healthy:
                await self._learn_models(worker)
        except (aiohttp.ClientError, TimeoutError) as exc:
            # a probe that only timed out on a worker still streaming, or still computing
            # the prefill queued on it, is a busy worker:
            # marking it down would cancel every request waiting on it (the proxy moves a
            # down worker's requests) and, fleet-wide under a burst, fail them all
            now = time.monotonic()
            healthy = isinstance(exc, TimeoutError) and worker.healthy and (
                worker.streaming_within(self._timeout_s, now)
                or worker.prefilling_within(self._timeout_s, now))
            if healthy:
                log.info("worker %s: /health timed out while it streams or prefills; kept up",
                         worker.id)
            elif isinstance(exc, aiohttp.ClientSSLError) and worker.id not in self._tls_failed:
                # an https worker whose certificate the router does not trust: say why, once
                self._tls_failed.add(worker.id)
                log.warning("worker %s: TLS failed: %s (--upstream-ca-file?)", worker.id, exc)
        if healthy:
            self._tls_failed.discard(worker.id)
        if healthy != worker.healthy:
            log.info("worker %s is %s", worker.id, "healthy" if healthy else "unhealthy")
            if healthy:
                worker.breaker.on_success()
        self._pool.set_health(worker, healthy, answered)
        self._metrics.healthy.labels(worker.id).set(1 if healthy else 0)

    async def _learn_models(self, worker: Worker) -> None:
        async with self._session.get(worker.url + "/v1/models", headers=worker.auth_headers(),
                                     timeout=self._timeout) as resp:
            if resp.status in (401, 403):  # vLLM's --api-key guards /v1, not /health
                log.warning("worker %s refused the router's credentials on /v1/models (%d): "
                            "give the router its key (--upstream-api-keys-file)", worker.id,
                            resp.status)
            if resp.status != 200:
                return
            body = await resp.read()
        parsed = parse_models(body)
        if parsed is None:  # its /health said yes: keep it, with the models last known
            log.warning("worker %s answered /v1/models with an unexpected body", worker.id)
            return
        models, adapters = parsed
        if (models and models != worker.models) or adapters != worker.adapters:
            worker.set_serving(models=models or None, adapters=adapters)


def parse_models(body: bytes) -> tuple[frozenset[str], dict[str, LoraAdapter]] | None:
    """The ids in an OpenAI model listing, and the LoRA adapters among them (vLLM's cards
    name an adapter's base model as ``parent`` and its path as ``root``); None unless it
    is ``{"data": [...]}``.

    Entries without an id are skipped; a body of any other shape is a worker's bug, and
    must cost that worker its model update, never the health loop."""
    try:
        listing = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(listing, dict) or not isinstance(data := listing.get("data", []), list):
        return None
    cards = [m for m in data if isinstance(m, dict) and isinstance(m.get("id"), str | int)]
    adapters = {str(m["id"]): LoraAdapter(str(m["id"]), m["parent"], str(m.get("root") or ""))
                for m in cards if isinstance(m.get("parent"), str)}
    return frozenset(str(m["id"]) for m in cards), adapters
