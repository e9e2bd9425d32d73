"""Which worker made each Responses API response id.

Why: vLLM keeps a stored response in the memory of the server that made it, so a
follow-up (``previous_response_id``), a retrieve or a cancel is answerable by that server
alone. The router remembers id -> worker id at the reply's first byte: in memory (an LRU
bounded by ``capacity``, entries older than the TTL forgotten), and, with Redis, also
under ``{prefix}response:{id}`` with the same TTL, so any router replica finds the owner.
The Redis write is a task off the request path; a lookup that misses memory costs one GET,
paid only by follow-ups.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections import OrderedDict
from collections.abc import AsyncIterator

from aiohttp import web
from redis.asyncio import Redis
from redis.exceptions import RedisError

from router.routing.accounting import Attempt

log = logging.getLogger(__name__)

# The first "id" of a Responses body is the response's: vLLM's ResponsesResponse (and
# OpenAI's) puts it first, and a stream's first event (response.created) carries it.
_ID = re.compile(rb'"id"\s*:\s*"([A-Za-z0-9_.:-]{1,128})"')
_SCAN_BYTES = 65536  # an id not found this far in is not coming
WRITE_TRIES = 4


class ResponseOwners:
    def __init__(self, redis: Redis | None = None, key_prefix: str = "prefix-router:",
                 ttl_s: float = 3600.0, capacity: int = 100_000) -> None:
        self._redis = redis
        self._prefix = key_prefix + "response:"
        self._ttl_s = ttl_s
        self._capacity = capacity
        self._local: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._writes: set[asyncio.Task[None]] = set()

    def remember(self, response_id: str, worker_id: str) -> None:
        self._local[response_id] = (worker_id, time.monotonic() + self._ttl_s)
        self._local.move_to_end(response_id)
        while len(self._local) > self._capacity:
            self._local.popitem(last=False)
        if self._redis is not None:
            task = asyncio.get_running_loop().create_task(self._write(response_id, worker_id))
            self._writes.add(task)
            task.add_done_callback(self._writes.discard)

    async def owner(self, response_id: str) -> str | None:
        """The id of the worker that made the response; None when no router knows it."""
        entry = self._local.get(response_id)
        if entry is not None:
            if entry[1] > time.monotonic():
                return entry[0]
            del self._local[response_id]
        if self._redis is None:
            return None
        for attempt in range(2):  # only follow-ups pay this, and a miss is a 404
            try:
                value = await self._redis.get(self._prefix + response_id)
                return value.decode() if isinstance(value, bytes) else value
            except (RedisError, OSError, TimeoutError) as exc:
                log.warning("response owner lookup failed (try %d of 2): %r", attempt + 1, exc)
        return None

    def watch(self, attempt: Attempt) -> None:
        """Learn the response id from a try's reply as it passes (first chunks only)."""
        attempt.observer = _IdWatcher(self)

    async def _write(self, response_id: str, worker_id: str) -> None:
        """Retried: a lost write makes another replica answer the id's follow-ups 404."""
        assert self._redis is not None
        for attempt in range(WRITE_TRIES):
            try:
                await self._redis.set(self._prefix + response_id, worker_id,
                                      ex=max(1, int(self._ttl_s)))
                return
            except (RedisError, OSError, TimeoutError) as exc:
                log.warning("response owner write failed (try %d of %d): %r", attempt + 1,
                            WRITE_TRIES, exc)
                await asyncio.sleep(0.1 * 2 ** attempt)

    async def close(self) -> None:
        if self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)


class _IdWatcher:
    """Scans a reply's first bytes for the response id, then stops looking."""

    __slots__ = ("done", "owners", "seen")

    def __init__(self, owners: ResponseOwners) -> None:
        self.owners = owners
        self.seen = bytearray()
        self.done = False

    def __call__(self, attempt: Attempt, data: bytes) -> None:
        if self.done:
            return
        self.seen.extend(data)
        found = _ID.search(self.seen)
        if found is not None:
            self.owners.remember(found.group(1).decode(), attempt.worker.id)
        self.done = found is not None or len(self.seen) > _SCAN_BYTES


RESPONSE_OWNERS = web.AppKey("response_owners", ResponseOwners)


async def response_owners_ctx(app: web.Application) -> AsyncIterator[None]:
    """Pending Redis writes finish before the shared client closes."""
    yield
    with contextlib.suppress(Exception):
        await app[RESPONSE_OWNERS].close()
