"""Per-tenant limits (requests/s and uncached prompt tokens/s), shared by router replicas.

Checked on the request path against local state only; spending reaches Redis in one
batched script call per ``sync_s`` (refill by Redis's clock, debit by every replica, a
register of live replicas), off the path. When that call fails the limits become local:
each router keeps 1/N of every limit, N the replicas seen at the last good sync, until
Redis answers again. A Redis outage never fails a request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from prometheus_client import Gauge
from redis.asyncio import Redis

from router.admission.buckets import Bucket
from router.infra.metrics import RouterMetrics
from router.infra.redis_client import timed

log = logging.getLogger(__name__)

# KEYS: the replica register, the active buckets. ARGV: ttl, replica id, horizon, then key,
# rate, burst, spent per bucket this replica spent from. Returns the live replicas, then
# key and level of every bucket any replica used within the horizon, so a router knows a
# tenant's shared level before that tenant's first request reaches it.
SYNC = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local ttl, replica, horizon = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
for i = 4, #ARGV, 4 do
  local key, rate, burst = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  local v = redis.call('HMGET', key, 'level', 'stamp')
  local level, stamp = tonumber(v[1]) or burst, tonumber(v[2]) or now
  level = math.min(burst, level + rate * math.max(0, now - stamp)) - tonumber(ARGV[i + 3])
  redis.call('HSET', key, 'level', level, 'stamp', now, 'rate', rate, 'burst', burst)
  redis.call('EXPIRE', key, ttl)
  redis.call('ZADD', KEYS[2], now, key)
end
redis.call('ZADD', KEYS[1], now, replica)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - horizon)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - ttl)
redis.call('EXPIRE', KEYS[1], ttl)
redis.call('EXPIRE', KEYS[2], ttl)
local out = {redis.call('ZCARD', KEYS[1])}
for _, key in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  local v = redis.call('HMGET', key, 'level', 'stamp', 'rate', 'burst')
  if v[1] then
    local level = math.min(tonumber(v[4]), tonumber(v[1]) + tonumber(v[3]) *
                           math.max(0, now - tonumber(v[2])))
    out[#out + 1] = key
    out[#out + 1] = tostring(level)
  end
end
return out
"""


class TenantLimits:
    """``check`` answers on the request path from memory; ``run`` syncs in the background."""

    def __init__(self, requests_per_s: float, tokens_per_s: float, burst_s: float,
                 metrics: RouterMetrics, shared_gauge: Gauge, redis: Redis | None = None, *,
                 key_prefix: str = "prefix-router:", replica_id: str = "",
                 sync_s: float = 0.1, timeout_s: float = 0.2,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._limits = {"requests": requests_per_s, "tokens": tokens_per_s}
        self._burst_s = burst_s
        self._metrics = metrics
        self._prefix = key_prefix + "limits:"
        self._replica = replica_id
        self._sync_s = sync_s
        self._timeout_s = timeout_s
        self._clock = clock
        self._buckets: dict[tuple[str, str], Bucket] = {}
        self._replicas = 1
        self.shared = redis is not None  # False while Redis is away
        self._script = redis.register_script(SYNC) if redis is not None else None
        self._metrics_shared = shared_gauge
        shared_gauge.set(1 if self.shared else 0)

    def check(self, tenant: str, tokens: float) -> float:
        """0 and both limits charged, or the seconds until the tenant may send again."""
        now = self._clock()
        wait = 0.0
        wanted = (("requests", 1.0), ("tokens", tokens))
        for kind, amount in wanted:
            if self._limits[kind] > 0:
                wait = max(wait, self._bucket(tenant, kind, now).wait_s(amount, now))
        if wait > 0:
            return wait
        for kind, amount in wanted:
            if self._limits[kind] > 0:
                self._buckets[(tenant, kind)].spend(amount, self.shared)
        return 0.0

    def _bucket(self, tenant: str, kind: str, now: float) -> Bucket:
        bucket = self._buckets.get((tenant, kind))
        if bucket is None:
            rate = self._limits[kind]
            bucket = self._buckets[(tenant, kind)] = Bucket.full(rate, rate * self._burst_s, now)
            if not self.shared:
                bucket.go_local(1.0 / self._replicas, now)
        return bucket

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._sync_s)
            await self.sync()

    async def sync(self) -> None:
        if self._script is None:
            return
        sent = {key: b.unsynced for key, b in self._buckets.items() if b.unsynced}
        args: list[float | str] = [max(60, int(10 * self._burst_s)), self._replica,
                                   max(3.0, 20 * self._sync_s)]
        for (tenant, kind), spent in sent.items():
            bucket = self._buckets[(tenant, kind)]
            args += [f"{self._prefix}{tenant}:{kind}", bucket.rate, bucket.burst, spent]
        try:
            async with asyncio.timeout(self._timeout_s):
                reply = await timed(self._metrics, "limits", self._script(
                    keys=[self._prefix + "replicas", self._prefix + "active"], args=args))
        except Exception as exc:  # noqa: BLE001 - any failure: limits become local
            if self.shared:
                log.warning("tenant limits are local until Redis answers: %r", exc)
                self._go_local()
            return
        now = self._clock()
        self._replicas = max(1, int(reply[0]))
        for raw_key, raw_level in zip(reply[1::2], reply[2::2], strict=True):
            tenant, _, kind = raw_key.decode()[len(self._prefix):].rpartition(":")
            if kind not in self._limits or self._limits[kind] <= 0:
                continue
            key = (tenant, kind)
            bucket = self._buckets.get(key) or self._bucket(tenant, kind, now)
            bucket.synced(float(raw_level), sent.get(key, 0.0) if self.shared else 0.0, now)
        self.shared = True
        self._metrics_shared.set(1)

    def _go_local(self) -> None:
        self.shared = False
        self._metrics_shared.set(0)
        now = self._clock()
        for bucket in self._buckets.values():
            bucket.go_local(1.0 / self._replicas, now)
