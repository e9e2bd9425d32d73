"""Worker registry in Redis: the one key schema that workers write and routers read.

A worker publishes a hash ``{prefix}{workers}:{id}`` and renews its membership in the
sorted set ``{prefix}{workers}`` whose score is the heartbeat's expiry (unix seconds). A worker
whose heartbeat lapses simply falls out of ``ZRANGEBYSCORE now +inf``; the hash itself
carries the same TTL so nothing is left behind. ``{workers}`` is a Redis Cluster hash tag:
every registry key lives in one slot, so a registration stays one MULTI on a cluster too.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field

import orjson
from redis.asyncio import Redis

DEFAULT_KEY_PREFIX = "prefix-router:"
# key of ``WorkerRecord.extra``: the fingerprint of the API key the worker's engine demands
# (vLLM's --api-key), never the key itself: whoever can read Redis must not learn it
API_KEY_FINGERPRINT = "api_key_sha256"


def key_fingerprint(api_key: str) -> str:
    """How a worker names its API key to routers holding it: sha256, first 16 hex."""
    return hashlib.sha256(api_key.encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class WorkerRecord:
    """What a worker tells the fleet about itself."""

    id: str
    url: str
    models: tuple[str, ...] = ()
    block_size: int = 16
    capacity_blocks: int = 0
    draining: bool = False
    kv_events_endpoint: str = ""
    extra: dict[str, str] = field(default_factory=dict)

    def to_hash(self) -> dict[str, str]:
        return {
            "id": self.id,
            "url": self.url,
            "models": orjson.dumps(list(self.models)).decode(),
            "block_size": str(self.block_size),
            "capacity_blocks": str(self.capacity_blocks),
            "draining": "1" if self.draining else "0",
            "kv_events_endpoint": self.kv_events_endpoint,
            "extra": orjson.dumps(self.extra).decode(),
        }

    @classmethod
    def from_hash(cls, raw: dict[bytes, bytes]) -> WorkerRecord:
        get = {k.decode(): v.decode() for k, v in raw.items()}
        return cls(
            id=get["id"],
            url=get["url"],
            models=tuple(orjson.loads(get.get("models", "[]"))),
            block_size=int(get.get("block_size", "16")),
            capacity_blocks=int(get.get("capacity_blocks", "0")),
            draining=get.get("draining") == "1",
            kv_events_endpoint=get.get("kv_events_endpoint", ""),
            extra=orjson.loads(get.get("extra", "{}")),
        )


def workers_key(prefix: str) -> str:
    return f"{prefix}{{workers}}"


def worker_key(prefix: str, worker_id: str) -> str:
    return f"{prefix}{{workers}}:{worker_id}"


async def publish(redis: Redis, record: WorkerRecord, ttl_s: float,
                  prefix: str = DEFAULT_KEY_PREFIX) -> None:
    """Register or renew a worker: one MULTI round trip.

    A renewal never clears ``draining``: an operator's ``set_draining`` must survive the
    worker's next heartbeat, so the flag is only ever set here, or created as "0".
    """
    key = worker_key(prefix, record.id)
    fields = record.to_hash()
    draining = fields.pop("draining")
    async with redis.pipeline(transaction=True) as pipe:
        pipe.hset(key, mapping=fields)
        if draining == "1":
            pipe.hset(key, "draining", "1")
        else:
            pipe.hsetnx(key, "draining", "0")
        pipe.pexpire(key, int(ttl_s * 1000))
        pipe.zadd(workers_key(prefix), {record.id: time.time() + ttl_s})
        await pipe.execute()


async def set_draining(redis: Redis, worker_id: str, draining: bool,
                       prefix: str = DEFAULT_KEY_PREFIX) -> None:
    await redis.hset(worker_key(prefix, worker_id), "draining", "1" if draining else "0")


async def remove(redis: Redis, worker_id: str, prefix: str = DEFAULT_KEY_PREFIX) -> None:
    async with redis.pipeline(transaction=True) as pipe:
        pipe.delete(worker_key(prefix, worker_id))
        pipe.zrem(workers_key(prefix), worker_id)
        await pipe.execute()


async def read_live(redis: Redis, prefix: str = DEFAULT_KEY_PREFIX) -> list[WorkerRecord]:
    """All workers whose heartbeat has not lapsed (two round trips, off the request path)."""
    now = time.time()
    ids = await redis.zrangebyscore(workers_key(prefix), now, "+inf")
    if not ids:
        return []
    async with redis.pipeline(transaction=False) as pipe:
        for worker_id in ids:
            pipe.hgetall(worker_key(prefix, worker_id.decode()))
        raws = await pipe.execute()
    return [WorkerRecord.from_hash(raw) for raw in raws if raw]
