"""Per-app router state, reached through an aiohttp AppKey (no module-level globals)."""

from __future__ import annotations

import ssl
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web
from redis.asyncio import Redis

from router.admission.controller import Admission
from router.config import RouterConfig
from router.fleet.breaker import CircuitBreaker
from router.fleet.health import HealthChecker
from router.fleet.prefill_model import PrefillModel
from router.fleet.upstream_keys import UpstreamKeys
from router.fleet.worker_cost import WorkerCost
from router.fleet.workers import Worker, WorkerPool
from router.infra.metrics import RouterMetrics
from router.residency.base import ResidencyStore
from router.routing.pipeline import Pipeline
from router.server.pool_hooks import install as install_pool_hooks
from router.server.proxy import Proxy

if TYPE_CHECKING:  # precise mode's dependencies are optional: imported only when configured
    from router.precise.matcher import PreciseMatcher


@dataclass
class RouterState:
    config: RouterConfig
    pool: WorkerPool
    pipeline: Pipeline
    residency: ResidencyStore
    metrics: RouterMetrics
    session: aiohttp.ClientSession | None = None
    proxy: Proxy | None = None
    health: HealthChecker | None = None
    redis: Redis | None = None  # shared client when ``config.redis_url`` is set
    precise: PreciseMatcher | None = None  # set when --tokenizers names any model
    admission: Admission | None = None  # set by admission_ctx when --admission is on
    prefill: PrefillModel = field(default_factory=PrefillModel)  # the fleet's line
    replica_id: str = field(default_factory=lambda: uuid.uuid4().hex)  # this router replica
    upstream_keys: UpstreamKeys = field(default_factory=UpstreamKeys)  # keys for workers
    upstream_ssl: ssl.SSLContext | None = None  # trust for https:// workers (None: system's)

    def __post_init__(self) -> None:
        self.prefill = PrefillModel(seed_rate=self.config.prefill_rate)
        install_pool_hooks(self)  # a worker leaving the pool leaves everything else too

    @property
    def mean_uncached(self) -> float:
        return self.pipeline.mean_uncached

    def apply_capacity(self, worker: Worker, capacity_blocks: int, block_size: int) -> None:
        """Cap the worker's residency at its engine's KV capacity, so the router's picture
        forgets blocks about when the engine's LRU evicts them. Tokens become prompt bytes
        at the ratio learned from the engines' usage (router/routing/feedback.py), so the
        cap follows the real tokenizer; called on every scrape, it applies changes only."""
        worker.capacity_blocks = capacity_blocks
        worker.block_size = block_size
        if capacity_blocks > 0:
            chars = capacity_blocks * block_size * self.pipeline.ratio.value
            blocks = max(1, int(chars // self.config.block_chars))
            if blocks != worker.residency_blocks:
                worker.residency_blocks = blocks
                self.residency.set_capacity(worker.id, blocks)

    def new_worker(self, worker_id: str, url: str, source: str,
                   models: frozenset[str] = frozenset(), key_fingerprint: str = "") -> Worker:
        """Every path that adds a worker builds it here, so each gets its breaker, its
        share of the prefill model and its upstream key the same way."""
        cfg = self.config
        return Worker(id=worker_id, url=url, models=models, source=source,
                      breaker=CircuitBreaker(cfg.breaker_threshold, cfg.breaker_cooldown_s),
                      cost=WorkerCost(prefill=self.prefill.child(), drains=cfg.queue_drain),
                      api_key=self.upstream_keys.for_worker(worker_id, url, key_fingerprint),
                      key_fingerprint=key_fingerprint)


ROUTER = web.AppKey("router", RouterState)
