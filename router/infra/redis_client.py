"""The router's one Redis client: built from ``redis_url``, shared by residency, discovery, load.

Retries are off inside redis-py on purpose: the callers decide what a failure means (the
residency store backs off and falls back to its local view; the background loops simply
try again on their next tick), so a dead Redis costs one fast failure, never a stack of
client-side retries on the request path.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from typing import TypeVar

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from router.infra.metrics import RouterMetrics

T = TypeVar("T")


def make_client(url: str) -> Redis:
    """redis://, rediss:// or unix:// (with password in the URL); connects lazily."""
    return Redis.from_url(url, socket_connect_timeout=1.0, socket_timeout=2.0,
                          retry=Retry(NoBackoff(), 0), health_check_interval=0)


async def timed(metrics: RouterMetrics, op: str, call: Awaitable[T]) -> T:
    """Await a Redis call, observing its latency or counting its failure under ``op``."""
    started = time.perf_counter()
    try:
        result = await call
    except BaseException:
        metrics.redis_errors.labels(op).inc()
        raise
    metrics.redis_latency.labels(op).observe(time.perf_counter() - started)
    return result
