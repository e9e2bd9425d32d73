"""Precise mode: workers not in the registry name their KV-event feed themselves.

vLLM answers ``GET /kv_event_sources`` with the endpoints its KV-event publisher bound
(router/protocol/kv_feed.py ``feed_from_sources``), so a static or admin-added worker
needs no ``--kv-events`` entry: the router asks each healthy one that has no feed yet,
once per address, and subscribes (on start, the subscriber first replays the worker's
buffer: router/protocol/kv_events.py). Registry workers advertise their feed in their
record instead, with the hash parameters; ``--kv-events`` still wins for the workers it
names. A worker that answers 404 (an older vLLM) or lists no source is not asked again
until it comes back at another address; an unreachable or refusing one is asked again
on the next round. The block size and hash seed are the static workers' settings
(``--precise-block-size``, ``--precise-hash-seed``): vLLM's answer does not carry them.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import orjson

from router.fleet.workers import Worker
from router.precise.feeds import KVEventFeeds
from router.protocol.kv_feed import SourcesError, feed_from_sources
from router.server.state import RouterState

log = logging.getLogger(__name__)
PATH = "/kv_event_sources"


class KVSourceDiscovery:
    def __init__(self, state: RouterState, session: aiohttp.ClientSession,
                 feeds: KVEventFeeds) -> None:
        self._state = state
        self._session = session
        self._feeds = feeds
        self._asked: dict[str, str] = {}  # worker id -> the address whose answer was final
        self._warned: set[str] = set()  # workers whose refusal was logged
        self._timeout = aiohttp.ClientTimeout(total=state.config.health_timeout_s)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._state.config.health_interval_s)
            await self.poll()

    async def poll(self) -> None:
        workers = list(self._state.pool)
        live = {w.id for w in workers}
        for worker_id in [w for w in self._asked if w not in live]:
            del self._asked[worker_id]
        wanted = [w for w in workers if w.source != "registry" and w.kv_events is None
                  and w.healthy and self._asked.get(w.id) != w.url]
        await asyncio.gather(*(self._ask(w) for w in wanted))

    async def _ask(self, worker: Worker) -> None:
        try:
            async with self._session.get(worker.url + PATH, headers=worker.auth_headers(),
                                         timeout=self._timeout) as resp:
                status, body = resp.status, await resp.read()
        except (aiohttp.ClientError, TimeoutError):
            return  # health checks deal with it; asked again next round
        if status == 404:
            self._asked[worker.id] = worker.url
            log.info("worker %s has no %s: give its KV events with --kv-events", worker.id,
                     PATH)
            return
        if status != 200:
            if worker.id not in self._warned:
                self._warned.add(worker.id)
                log.warning("worker %s answered %s with %d", worker.id, PATH, status)
            return
        try:
            params = feed_from_sources(orjson.loads(body), worker.url,
                                       self._state.config.precise_block_size,
                                       self._state.config.precise_hash_seed)
        except (SourcesError, orjson.JSONDecodeError) as exc:
            self._asked[worker.id] = worker.url
            log.warning("worker %s: KV-event sources not followed: %s", worker.id, exc)
            return
        self._asked[worker.id] = worker.url
        if params is None or self._state.pool.get(worker.id) is not worker \
                or worker.kv_events is not None:
            return  # publishes nothing, or replaced / configured meanwhile
        worker.kv_events = params
        self._feeds.ensure(worker.id, params)
