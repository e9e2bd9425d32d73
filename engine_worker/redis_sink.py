"""Exact residency written to Redis: ``{prefix}exact:{{worker}}``, a set of vLLM block keys
(the worker id is the Redis Cluster hash tag, as for the router's ``res:`` sets).

The optional path beside the routers' own subscriptions (router/precise/feeds.py says why
routers subscribe directly): a worker's launcher subscribes to its own engine and keeps
this set equal to the blocks the engine reported stored and not removed, for consumers that
cannot reach the workers' ZMQ sockets (dashboards, a router outside the cluster network).
Members are the low-64-bit int keys in decimal (what vLLM publishes by default). Every write
refreshes the key's TTL, so a worker that dies leaves nothing behind. Duplicate physical
blocks with one hash are not counted (a set): a removal of one copy removes the member, an
underestimate the next store corrects.
"""

from __future__ import annotations

from router.infra.redis_client import RedisClient
from router.protocol.kv_contract import BlockHash, block_key


def exact_key(prefix: str, worker_id: str) -> str:
    return f"{prefix}exact:{{{worker_id}}}"


class RedisExactSink:
    """A ResidencySink that mirrors one or more workers' exact residency into Redis."""

    def __init__(self, redis: RedisClient, prefix: str = "prefix-router:", ttl_s: float = 3600.0
                 ) -> None:
        self._redis = redis
        self._prefix = prefix
        self._ttl_ms = int(ttl_s * 1000)

    async def stored(self, worker_id: str, block_hashes: list[BlockHash],
                     medium: str | None = None) -> None:
        """GPU residency only: the launcher subscribes with the default (GPU) media."""
        key = exact_key(self._prefix, worker_id)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.sadd(key, *(block_key(h) for h in block_hashes))
            pipe.pexpire(key, self._ttl_ms)
            await pipe.execute()

    async def removed(self, worker_id: str, block_hashes: list[BlockHash],
                      medium: str | None = None) -> None:
        await self._redis.srem(exact_key(self._prefix, worker_id),
                               *(block_key(h) for h in block_hashes))

    async def cleared(self, worker_id: str) -> None:
        await self._redis.delete(exact_key(self._prefix, worker_id))
