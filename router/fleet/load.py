"""Shared load: what the bounded-load policy must count beyond this replica's own in-flight.

Two sources, both off the request path, both folded into ``Worker.external_load``:
- other router replicas: each replica publishes ``{prefix}load:{replica}`` (a hash worker ->
  in-flight, TTL 3 x ``load_publish_s``) and renews itself in the sorted set
  ``{prefix}replicas`` (score = expiry, like the worker registry); it reads the other
  live replicas' hashes in the same pipeline, so a tick is one round trip;
- the engines themselves: ``vllm:num_requests_running + vllm:num_requests_waiting`` scraped
  from each worker's ``/metrics`` every ``scrape_interval_s`` (with or without Redis),
  which also sees traffic that bypasses the routers.

external_load = round(max(sum of other replicas' in-flight, engine's running+waiting - ours)):
the two mostly count the same requests, so adding them would double count; the larger
is the better lower bound of what else the worker is doing. Stale data (a replica or a
scrape older than three periods) counts as zero so a dead peer cannot pin a worker's load.

Why replicas publish a time average, not a snapshot: a snapshot is held by the readers
for a whole period, so one short request caught in flight reads as a full unit of load
for 250 ms. At low load the bound is ceil(1.25 (L+1)/n), i.e. 1 or 2, and one phantom
unit pushes a context off its warm worker (measured: two replicas agreed on 77 % of
placements with snapshots). The mean in-flight over the period (sampled 8 times) is the
expected concurrent load (Little's law) and matches the snapshot under steady high load.
For the same reason the engine's excess over our own in-flight is taken at scrape time,
against our in-flight at that moment, and smoothed (EWMA, alpha 1/4, rounded): a request
caught once in a 1 s scrape reads as 0.25 and rounds away; sustained load shows within
two to three scrapes. Measured on the two-replica agreement test: raw snapshots 77 %,
means + alpha 1/2 95 %, alpha 1/4 see tests/redis/test_agreement.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from typing import Protocol

import aiohttp
from redis.asyncio import Redis

from router.config import RouterConfig
from router.fleet.engine_cost import observe_engine
from router.fleet.workers import Worker, WorkerPool
from router.infra.metrics import RouterMetrics
from router.infra.redis_client import timed
from router.protocol import vllm_metrics


class LoadHost(Protocol):
    """What the load loops read of the app (RouterState provides it)."""

    config: RouterConfig
    pool: WorkerPool
    metrics: RouterMetrics

    @property
    def mean_uncached(self) -> float:
        """Uncached prompt tokens per dispatch, to price an engine's unaccounted queue."""
        ...

    def apply_capacity(self, worker: Worker, capacity_blocks: int, block_size: int) -> None: ...

log = logging.getLogger(__name__)

SAMPLES = 8  # in-flight samples per publish period
ALPHA = 0.25  # EWMA weight of the newest engine scrape


class LoadView:
    """Other replicas' and engines' load per worker, with freshness, applied to the pool."""

    def __init__(self, state: LoadHost) -> None:
        self._state = state
        self.others: dict[str, float] = {}
        self.others_cost: dict[str, tuple[float, float]] = {}  # pending tokens, decoding
        self.others_at = 0.0
        self.engine: dict[str, tuple[float, float]] = {}  # worker -> (smoothed excess, when)

    def apply(self) -> None:
        cfg = self._state.config
        now = time.monotonic()
        others_fresh = now - self.others_at <= 3 * cfg.load_publish_s
        engine_max_age = 3 * cfg.scrape_interval_s
        for worker in self._state.pool:
            others = self.others.get(worker.id, 0.0) if others_fresh else 0.0
            excess = 0.0
            if (scraped := self.engine.get(worker.id)) is not None \
                    and now - scraped[1] <= engine_max_age:
                excess = scraped[0]
            worker.set_external_load(max(round(others), round(excess), 0))
            shared = self.others_cost.get(worker.id, (0.0, 0.0)) if others_fresh else (0.0, 0.0)
            cost = worker.cost
            cost.shared_pending_tokens, cost.shared_decoding = shared
            cost.prefill.refresh()
            metrics = self._state.metrics
            metrics.pending_prefill.labels(worker.id).set(cost.queued_tokens())
            metrics.decode_load.labels(worker.id).set(cost.decode_load())
            metrics.prefill_rate.labels(worker.id).set(cost.prefill.rate)

    def observe_engine(self, worker_id: str, excess: int) -> None:
        """Fold one scrape (engine's running+waiting minus ours) into the smoothed excess."""
        previous = self.engine.get(worker_id)
        smoothed = (0.0 if previous is None else previous[0]) * (1 - ALPHA) + excess * ALPHA
        self.engine[worker_id] = (smoothed, time.monotonic())


class LoadSharer:
    """Publishes this replica's in-flight per worker and reads the other replicas'."""

    def __init__(self, state: LoadHost, redis: Redis, view: LoadView,
                 replica_id: str | None = None) -> None:
        self.replica_id = replica_id or uuid.uuid4().hex
        self._state = state
        self._redis = redis
        self._view = view
        prefix = state.config.redis_key_prefix
        self._replicas_key = f"{prefix}replicas"
        self._prefix = prefix
        self._peers: list[str] = []  # other live replicas, as of the previous tick
        self._sums: dict[str, int] = {}  # in-flight samples summed over the current period
        self._samples = 0

    def _load_key(self, replica_id: str) -> str:
        return f"{self._prefix}load:{replica_id}"

    async def run(self) -> None:
        period = self._state.config.load_publish_s
        while True:
            await self.tick()
            for _ in range(SAMPLES):
                await asyncio.sleep(period / SAMPLES)
                self.sample()

    def sample(self) -> None:
        self._samples += 1
        for worker in self._state.pool:
            if worker.in_flight:
                self._sums[worker.id] = self._sums.get(worker.id, 0) + worker.in_flight

    def _mean_in_flight(self) -> dict[str, str]:
        """Mean in-flight per worker since the last publish; resets the period."""
        if not self._samples:
            self.sample()
        means = {w: f"{total / self._samples:.3f}" for w, total in self._sums.items()}
        self._sums, self._samples = {}, 0
        for worker in self._state.pool:  # and the prefill/decode cost, as of now
            cost = worker.cost
            if cost.pending or cost.decoding:
                means[worker.id] = (f"{means.get(worker.id, '0')},{cost.pending_tokens:.0f},"
                                    f"{cost.decoding}")
        return means

    async def tick(self) -> None:
        try:
            await timed(self._state.metrics, "load", self._exchange())
        except Exception as exc:  # noqa: BLE001 - stale peers expire; try again next tick
            log.debug("load exchange failed: %r", exc)
        self._view.apply()

    async def _exchange(self) -> None:
        ttl_s = 3 * self._state.config.load_publish_s
        now = time.time()
        own = self._mean_in_flight()
        key = self._load_key(self.replica_id)
        peers = self._peers
        async with self._redis.pipeline(transaction=False) as pipe:
            for peer in peers:
                pipe.hgetall(self._load_key(peer))
            pipe.delete(key)
            if own:
                pipe.hset(key, mapping=own)
                pipe.pexpire(key, int(ttl_s * 1000))
            pipe.zadd(self._replicas_key, {self.replica_id: now + ttl_s})
            pipe.zremrangebyscore(self._replicas_key, "-inf", now)
            pipe.zrangebyscore(self._replicas_key, now, "+inf")
            pipe.pexpire(self._replicas_key, int(max(60.0, 10 * ttl_s) * 1000))
            results = await pipe.execute()
        others: dict[str, float] = {}
        costs: dict[str, tuple[float, float]] = {}
        for raw in results[: len(peers)]:
            for worker_id, value in raw.items():
                wid = worker_id.decode()
                mean, *cost = value.split(b",")
                others[wid] = others.get(wid, 0.0) + float(mean)
                if len(cost) == 2:
                    tokens, decoding = costs.get(wid, (0.0, 0.0))
                    costs[wid] = (tokens + float(cost[0]), decoding + float(cost[1]))
        self._view.others_cost = costs
        live = results[-2]
        self._peers = [r.decode() for r in live if r.decode() != self.replica_id]
        self._view.others = others
        self._view.others_at = time.monotonic()

    async def withdraw(self) -> None:
        """On shutdown: our in-flight is gone, don't let peers count it for a TTL."""
        with contextlib.suppress(Exception):
            async with asyncio.timeout(1.0), self._redis.pipeline(transaction=False) as pipe:
                pipe.delete(self._load_key(self.replica_id))
                pipe.zrem(self._replicas_key, self.replica_id)
                await pipe.execute()


class Scraper:
    """Reads each worker's own /metrics: its queue (the engine's view of its load) and its KV
    capacity (so residency mirrors the engine's cache size without any configuration)."""

    def __init__(self, state: LoadHost, session: aiohttp.ClientSession,
                 view: LoadView) -> None:
        self._state = state
        self._session = session
        self._view = view
        interval = state.config.scrape_interval_s
        self._timeout = aiohttp.ClientTimeout(total=max(0.2, min(2.0, interval)))

    async def run(self) -> None:
        while True:
            await self.scrape_all()
            await asyncio.sleep(self._state.config.scrape_interval_s)

    async def scrape_all(self) -> None:
        """Scrape every healthy worker; one worker's failure never stops the others'."""
        workers = [w for w in self._state.pool if w.healthy]
        results = await asyncio.gather(*(self._scrape(w) for w in workers),
                                       return_exceptions=True)
        for worker, result in zip(workers, results, strict=True):
            if isinstance(result, Exception):
                log.error("scrape of worker %s failed", worker.id, exc_info=result)
        live = {w.id for w in self._state.pool}
        for worker_id in list(self._view.engine):
            if worker_id not in live:
                del self._view.engine[worker_id]
        self._view.apply()

    async def _scrape(self, worker: Worker) -> None:
        try:
            async with self._session.get(worker.url + "/metrics", headers=worker.auth_headers(),
                                         timeout=self._timeout) as resp:
                if resp.status != 200:
                    return
                text = await resp.text()
                ours = worker.in_flight  # as close to the engine's sampling moment as we get
        except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError):
            return
        stats = vllm_metrics.parse(text)
        if stats.has_queue:
            self._view.observe_engine(worker.id, stats.in_flight - ours)
            observe_engine(worker, stats, self._state.mean_uncached)
        if stats.capacity_blocks is not None and stats.block_size is not None:
            self._state.apply_capacity(worker, stats.capacity_blocks, stats.block_size)
