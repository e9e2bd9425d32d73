"""Redis residency: the fleet-wide picture of which worker holds which chain blocks warm.

Layout: one sorted set per worker, ``{prefix}res:{{worker}}`` (the worker id is the hash
tag, so on Redis Cluster the workers' sets spread over the masters), member = an 8-byte chain link,
score = last use in microseconds minus the link's index in its chain. Why a sorted set
rather than a hash: the score *is* the LRU order, so capacity is one ``ZREMRANGEBYRANK``
(drop all but the newest ``capacity`` members; a capacity in head blocks becomes members
at the mix of head and tail links the local mirror holds, ``ChainShape``) and per-entry
expiry is one ``ZREMRANGEBYSCORE`` below ``now - ttl``, both O(log n + removed) on the
server, with no client-side bookkeeping shared between router replicas; membership is
still an O(1) ``ZSCORE`` (the set keeps a dict beside its skiplist). Subtracting the index makes the
leading blocks of a chain the most recent, so LRU trims tails before heads and the
"resident blocks form a prefix" property that binary search relies on survives eviction.
The key itself also carries a TTL, renewed by every write, so an abandoned worker's set
disappears on its own.

Reads: one EVALSHA per routing decision (a read-only Lua script binary-searching every
candidate's set). On Redis Cluster a script may only touch keys of one slot, so the
candidates' keys are grouped by slot and each group is one EVALSHA, all of them in one
cluster pipeline: one round trip per master, in parallel. Writes: ``record`` queues; a
background task flushes every ~50 ms (at once when ``batch_size`` records wait, or when a
record places a context that matched nowhere, so replicas agree on new placements) in one
non-transactional pipeline.

Degradation: ``match`` waits at most ``redis_timeout_ms``; any failure counts
``prefix_router_redis_errors_total{op}`` (op "match", or "match_timeout" for a late reply,
which is left to finish on its connection rather than cancelled mid-read). An error, or
three late replies in a row, opens a backoff window (0.1 s doubling to 5 s) during which
Redis is not touched; the answer then comes from a local ``MemoryResidency`` mirror that
records everything this router routes. After the window one caller (reads or the flusher)
probes; success closes the window and queued writes (bounded, oldest dropped) drain. A
Redis outage therefore never fails, or even slows, a client request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict, deque
from collections.abc import Collection, Sequence

from redis.crc import key_slot
from redis.exceptions import NoScriptError

from router.infra.metrics import RouterMetrics
from router.infra.redis_client import RedisClient, is_cluster, timed
from router.residency.base import UNIFORM, ChainShape
from router.residency.memory import MemoryResidency

log = logging.getLogger(__name__)

# For each KEYS[k] (a worker's set) the longest n such that ARGV[1..n] are all members,
# by binary search over the chain (monotone: a resident link's ancestors are resident).
MATCH_LUA = """#!lua flags=no-writes
local n = #ARGV
local out = {}
for k = 1, #KEYS do
  local key = KEYS[k]
  local lo = 0
  if redis.call('ZSCORE', key, ARGV[1]) then
    lo = 1
    local hi = n
    while lo < hi do
      local mid = math.floor((lo + hi + 1) / 2)
      if redis.call('ZSCORE', key, ARGV[mid]) then lo = mid else hi = mid - 1 end
    end
  end
  out[k] = lo
end
return out
"""


def _consume(task: asyncio.Future[object]) -> None:
    """Retrieve a late call's outcome so asyncio does not log it as never retrieved."""
    if not task.cancelled():
        task.exception()


SLOW_RUN = 3  # consecutive late replies that count as an outage


class Backoff:
    """Circuit for a shared dependency: closed, open for a growing window, one probe after it."""

    def __init__(self, initial_s: float = 0.1, max_s: float = 5.0) -> None:
        self._initial_s = initial_s
        self._max_s = max_s
        self._window_s = 0.0
        self._until = 0.0
        self._probing = False
        self._slow_run = 0  # consecutive late replies

    @property
    def down(self) -> bool:
        return self._window_s > 0

    def acquire(self) -> bool:
        """May the caller use Redis now? While down, only one caller probes at a time."""
        if not self.down:
            return True
        if self._probing or time.monotonic() < self._until:
            return False
        self._probing = True
        return True

    def success(self) -> None:
        if self.down:
            log.info("redis is back")
        self._window_s = 0.0
        self._probing = False

    def slow(self) -> None:
        """A late reply: Redis is alive. Only a run of them (a hung or swamped server) opens
        the window, so one scheduling hiccup on a busy box doesn't turn Redis off."""
        self._slow_run += 1
        if self._slow_run >= SLOW_RUN:
            self.failure()
        self._probing = False

    def failure(self) -> None:
        if not self.down:
            log.warning("redis failed; routing on the local residency view")
        self._window_s = min(self._max_s, max(self._initial_s, self._window_s * 2))
        self._until = time.monotonic() + self._window_s
        self._probing = False


class RedisResidency:
    """Same interface as ``MemoryResidency``; shared by every router replica through Redis."""

    def __init__(self, client: RedisClient, metrics: RouterMetrics, *, key_prefix: str,
                 ttl_s: float, timeout_ms: float, default_capacity: int = 65536,
                 shape: ChainShape = UNIFORM, flush_interval_s: float = 0.05,
                 batch_size: int = 256, max_pending: int = 10000) -> None:
        self._redis = client
        self._metrics = metrics
        self._prefix = key_prefix
        self._ttl_s = ttl_s
        self._timeout_s = timeout_ms / 1000.0
        self._default_capacity = default_capacity
        self._capacity: dict[str, int] = {}
        self._flush_interval_s = flush_interval_s
        self._batch_size = batch_size
        self._pending: deque[tuple[str, Sequence[bytes], int]] = deque(maxlen=max_pending)
        self._forgotten: set[str] = set()
        self._evicted: dict[str, int] = {}  # worker -> drop members scored at or below
        self._cold: set[bytes] = set()  # chain heads that matched nowhere, awaiting a record
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._script = client.register_script(MATCH_LUA)
        self._cluster = is_cluster(client)
        self._cluster_loaded = False  # MATCH_LUA loaded on every master
        self.local = MemoryResidency(default_capacity, shape)
        self.backoff = Backoff()

    def key(self, worker_id: str) -> str:
        return residency_key(self._prefix, worker_id)

    async def match(self, chain: Sequence[bytes], worker_ids: Collection[str]) -> dict[str, int]:
        if not chain or not worker_ids:
            return {}
        worker_ids = list(worker_ids)  # one order for the keys sent and the lengths read
        local = await self.local.match(chain, worker_ids)
        if not self.backoff.acquire():
            return local
        call = asyncio.ensure_future(timed(self._metrics, "match", self._lengths(
            [self.key(w) for w in worker_ids], list(chain))))
        try:
            # shielded: a late reply is left to land on its connection instead of cancelling
            # it mid-read, which would cost a disconnect and a reconnect (a storm on a busy box)
            async with asyncio.timeout(self._timeout_s):
                lengths = await asyncio.shield(call)
        except Exception as exc:  # noqa: BLE001 - any Redis trouble means "use the local view"
            log.debug("residency match failed: %r", exc)
            if call.done():
                self.backoff.failure()
            else:
                self._metrics.redis_errors.labels("match_timeout").inc()
                call.add_done_callback(_consume)
                self.backoff.slow()
            return local
        self.backoff.success()
        # our own decisions not yet flushed are known locally: take the longer of the two
        result = {w: int(n) for w, n in zip(worker_ids, lengths, strict=True) if n}
        for worker_id, n in local.items():
            if n > result.get(worker_id, 0):
                result[worker_id] = n
        if not result:
            self._note_cold(chain[0])
        return result

    async def _lengths(self, keys: list[str], chain: list[bytes]) -> list[int]:
        """The script's answer for every key: one call, or one per slot on a cluster."""
        if not self._cluster:
            return await self._script(keys=keys, args=chain)
        if not self._cluster_loaded:
            await self._redis.script_load(MATCH_LUA)  # to every master
            self._cluster_loaded = True
        slots: dict[int, list[int]] = defaultdict(list)
        for index, key in enumerate(keys):
            slots[key_slot(key.encode())].append(index)
        groups = list(slots.values())
        try:
            async with self._redis.pipeline() as pipe:
                for group in groups:
                    # execute_command: redis-py blocks pipe.evalsha on clusters, though a
                    # script whose keys share one slot is exactly what a cluster runs
                    pipe.execute_command("EVALSHA", self._script.sha, len(group),
                                         *(keys[i] for i in group), *chain)
                answers = await pipe.execute()
        except NoScriptError:
            self._cluster_loaded = False  # a master restarted or failed over: load again
            raise
        lengths = [0] * len(keys)
        for group, answer in zip(groups, answers, strict=True):
            for index, n in zip(group, answer, strict=True):
                lengths[index] = n
        return lengths

    def _note_cold(self, head: bytes) -> None:
        if len(self._cold) >= 4096:  # bounded: a head that was never recorded ages out
            self._cold.clear()
        self._cold.add(head)

    def record(self, worker_id: str, chain: Sequence[bytes]) -> None:
        if not chain:
            return
        self.local.record(worker_id, chain)
        if len(self._pending) == self._pending.maxlen:  # full while Redis is away
            self._metrics.residency_dropped_records.inc()
        self._pending.append((worker_id, chain, time.time_ns() // 1000))
        # a first placement (no worker held this context) is written at once, not within
        # the batch period: another replica routing the same context in those ~50 ms would
        # otherwise place it elsewhere, and the context would stay split between two workers
        if len(self._pending) >= self._batch_size or chain[0] in self._cold:
            self._cold.discard(chain[0])
            self._wake.set()

    def set_capacity(self, worker_id: str, blocks: int) -> None:
        self._capacity[worker_id] = max(1, blocks)
        self.local.set_capacity(worker_id, blocks)

    def stamp(self, worker_id: str, block: bytes) -> int | None:
        return self.local.stamp(worker_id, block)

    def drop_older(self, worker_id: str, stamp: int) -> int:
        """Scores and local stamps are the same clock, so the shared set drops every member
        last used before the evicted block, whichever replica recorded it."""
        self._evicted[worker_id] = max(stamp, self._evicted.get(worker_id, stamp))
        self._wake.set()
        return self.local.drop_older(worker_id, stamp)

    def forget(self, worker_id: str) -> None:
        """A removed worker's cache is gone (or unknown): drop its shared set too."""
        self._capacity.pop(worker_id, None)
        self.local.forget(worker_id)
        self._forgotten.add(worker_id)
        self._wake.set()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._flusher())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.local.close()
        if not self.backoff.down:  # last chance to hand our picture to the other replicas
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await self.flush()

    async def _flusher(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._flush_interval_s):
                    await self._wake.wait()
            self._wake.clear()
            if not (self._pending or self._forgotten or self._evicted) \
                    or not self.backoff.acquire():
                continue
            try:
                await self.flush()
            except Exception as exc:  # noqa: BLE001 - keep the loop alive through outages
                log.debug("residency flush failed: %r", exc)
                self.backoff.failure()
            else:
                self.backoff.success()

    async def flush(self) -> None:
        """Write queued records in one pipeline; on failure they go back to the queue's front."""
        taken = list(self._pending)
        self._pending.clear()
        forgotten, self._forgotten = self._forgotten, set()
        evicted, self._evicted = self._evicted, {}
        try:
            await timed(self._metrics, "record", self._write(taken, forgotten, evicted))
        except BaseException:
            for worker_id, stamp in evicted.items():
                self._evicted[worker_id] = max(stamp, self._evicted.get(worker_id, stamp))
            room = (self._pending.maxlen or 0) - len(self._pending)
            self._pending.extendleft(reversed(taken[-room:] if room > 0 else []))
            if (lost := len(taken) - max(0, room)) > 0:
                self._metrics.residency_dropped_records.inc(lost)
            self._forgotten |= forgotten - {w for w, _, _ in self._pending}
            raise

    async def _write(self, records: list[tuple[str, Sequence[bytes], int]],
                     forgotten: set[str], evicted: dict[str, int]) -> None:
        scores: dict[str, dict[bytes, int]] = defaultdict(dict)
        for worker_id, chain, now_us in records:
            if worker_id in forgotten:
                continue
            members = scores[worker_id]
            for index, link in enumerate(chain):
                members[link] = now_us - index  # later records overwrite: newest use wins
        oldest = time.time_ns() // 1000 - int(self._ttl_s * 1e6)
        ttl_ms = int(self._ttl_s * 1000)
        async with self._redis.pipeline(transaction=False) as pipe:
            for worker_id in forgotten:
                pipe.delete(self.key(worker_id))
            for worker_id, stamp in evicted.items():  # before this batch's newer records
                pipe.zremrangebyscore(self.key(worker_id), "-inf", stamp)
            for worker_id, members in scores.items():
                key = self.key(worker_id)
                # a sorted set caps by count: the links the capacity holds at the mix of
                # head and tail links this replica's mirror sees on the worker
                capacity = self.local.links_within(
                    worker_id, self._capacity.get(worker_id, self._default_capacity))
                pipe.zadd(key, members)
                pipe.zremrangebyscore(key, "-inf", f"({oldest}")
                pipe.zremrangebyrank(key, 0, -(capacity + 1))
                pipe.pexpire(key, ttl_ms)
            await pipe.execute()


def residency_key(prefix: str, worker_id: str) -> str:
    """A worker's residency set; the braces make the worker id its Redis Cluster hash tag."""
    return f"{prefix}res:{{{worker_id}}}"
