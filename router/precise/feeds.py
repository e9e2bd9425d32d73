"""One KV-event subscription per worker, kept in step with the router's pool.

Why every router replica subscribes to every worker itself (ZMQ PUB fans out to any number
of SUB sockets) rather than one subscriber writing exact residency into Redis for all
replicas to read: the events are already a replicated log, so a replica's exact residency
costs no Redis round trip on the request path, no write amplification (a BlockStored per
block per replica instead of one Redis write per block plus a read per decision), and it
keeps working through a Redis outage. The cost is N_routers x N_workers TCP connections and
each replica holding the block sets in memory (8 bytes per block per worker, plus dict
overhead: ~1 MB for 10 k blocks), which is small next to the engine's cache.

A worker's feed carries the parameters its hashes depend on (block size, PYTHONHASHSEED):
the matcher only compares chains computed with the same ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from router.precise.exact import ExactResidency
from router.precise.kv_events import KVEventSubscriber

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class FeedParams:
    endpoint: str
    replay_endpoint: str | None
    topic: str
    block_size: int
    hash_seed: str


class KVEventFeeds:
    """Starts, replaces and stops subscribers; all of them write into one ExactResidency."""

    def __init__(self, residency: ExactResidency) -> None:
        self.residency = residency
        self._params: dict[str, FeedParams] = {}
        self._subs: dict[str, KVEventSubscriber] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def ensure(self, worker_id: str, params: FeedParams) -> None:
        """Subscribe to a worker (no-op if already subscribed with the same parameters)."""
        if self._params.get(worker_id) == params:
            return
        self.drop(worker_id)  # a new address is a new engine: its old blocks are gone
        sub = KVEventSubscriber(worker_id, params.endpoint, self.residency,
                                replay_endpoint=params.replay_endpoint, topic=params.topic)
        self._params[worker_id] = params
        self._subs[worker_id] = sub
        self._tasks[worker_id] = asyncio.create_task(sub.run(), name=f"kv-events-{worker_id}")
        log.info("subscribed to %s kv events at %s", worker_id, params.endpoint)

    def drop(self, worker_id: str) -> None:
        task = self._tasks.pop(worker_id, None)
        if task is not None:
            task.cancel()
        self._subs.pop(worker_id, None)
        self._params.pop(worker_id, None)
        self.residency.forget(worker_id)

    def params(self, worker_id: str) -> FeedParams | None:
        return self._params.get(worker_id)

    def worker_ids(self) -> list[str]:
        return list(self._subs)

    def subscriber(self, worker_id: str) -> KVEventSubscriber | None:
        return self._subs.get(worker_id)

    async def wait_subscribed(self) -> None:
        """Until every subscriber's socket is connecting (tests and start-up use this)."""
        await asyncio.gather(*(s.subscribed.wait() for s in self._subs.values()))

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        for worker_id in list(self._tasks):
            self.drop(worker_id)
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
