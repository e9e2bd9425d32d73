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
import logging

from router.infra.supervisor import Supervisor
from router.precise.exact import ExactResidency
from router.protocol.kv_contract import ALL_MEDIA
from router.protocol.kv_events import KVEventSubscriber
from router.protocol.kv_feed import FeedParams

log = logging.getLogger(__name__)


def _task_name(worker_id: str) -> str:
    return f"kv-events:{worker_id}"


class KVEventFeeds:
    """Starts, replaces and stops subscribers; all of them write into one ExactResidency.

    Each subscriber runs under the app's supervisor (a subscriber that raises is restarted,
    and counted as task ``kv-events``); without one, under a private supervisor."""

    def __init__(self, residency: ExactResidency, supervisor: Supervisor | None = None) -> None:
        self.residency = residency
        self._supervisor = supervisor if supervisor is not None else Supervisor()
        self._params: dict[str, FeedParams] = {}
        self._subs: dict[str, KVEventSubscriber] = {}

    def ensure(self, worker_id: str, params: FeedParams) -> None:
        """Subscribe to a worker (no-op if already subscribed with the same parameters)."""
        if self._params.get(worker_id) == params:
            return
        self.drop(worker_id)  # a new address is a new engine: its old blocks are gone
        sub = KVEventSubscriber(worker_id, params.endpoint, self.residency,
                                replay_endpoint=params.replay_endpoint, topic=params.topic,
                                media=ALL_MEDIA)  # offload tiers weigh in too
        self._params[worker_id] = params
        self._subs[worker_id] = sub
        self._supervisor.start(_task_name(worker_id), sub.run, label="kv-events")
        log.info("subscribed to %s kv events at %s", worker_id, params.endpoint)

    def drop(self, worker_id: str) -> None:
        self._supervisor.cancel(_task_name(worker_id))
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
        for worker_id in list(self._subs):
            await self._supervisor.stop(_task_name(worker_id))
            self.drop(worker_id)
