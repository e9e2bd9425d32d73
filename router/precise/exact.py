"""Where KV events land: the sink interface, and an exact in-memory residency store.

ExactResidency is what the router matches against in precise mode (router/precise/); any
other store that implements the three coroutines (e.g. one writing to Redis) can be fed by
the same subscriber.

Block hashes arrive as ints (vLLM's default, VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1: the low
64 bits of the sha256 digest) or as the digest bytes. ExactResidency keys everything by the
int form (`block_key`), so a router that computes sha256_cbor digests itself can compare
them with either kind of worker.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from router.protocol.kv_contract import GPU_MEDIA, BlockHash, ResidencySink, block_key

__all__ = ["BlockHash", "ExactResidency", "ResidencySink", "block_key"]


class ExactResidency:
    """Per worker, the blocks it reported stored and not since removed.

    Counted, not a plain set: vLLM may hold two physical blocks with the same hash (the same
    prefix computed by two requests at once) and reports each store and each eviction, so a
    block stays resident until its last copy is removed. A removal of a block never seen
    stored (we subscribed late) is ignored rather than driving the count negative.
    """

    def __init__(self, max_watched: int = 65536) -> None:
        self._blocks: dict[str, Counter[int]] = {}  # vLLM's own (GPU) cache
        self._offload: dict[str, Counter[int]] = {}  # offload tiers (CPU, disk: LMCache)
        # chain heads a match has asked about -> the workers holding them, per tier; kept
        # current by every store and removal, so a match probes only those workers
        self._holders: dict[bool, dict[int, set[str]]] = {True: {}, False: {}}
        self._max_watched = max_watched

    def _tier(self, medium: str | None) -> dict[str, Counter[int]]:
        return self._blocks if medium in GPU_MEDIA else self._offload

    async def stored(self, worker_id: str, block_hashes: list[BlockHash],
                     medium: str | None = None) -> None:
        counts = self._tier(medium).setdefault(worker_id, Counter())
        watched = self._holders[medium in GPU_MEDIA]
        for block_hash in block_hashes:
            key = block_key(block_hash)
            counts[key] += 1
            if key in watched:
                watched[key].add(worker_id)

    async def removed(self, worker_id: str, block_hashes: list[BlockHash],
                      medium: str | None = None) -> None:
        counts = self._tier(medium).get(worker_id)
        if counts is None:
            return
        watched = self._holders[medium in GPU_MEDIA]
        for block_hash in block_hashes:
            key = block_key(block_hash)
            if counts.get(key, 0) > 1:
                counts[key] -= 1
            elif counts.pop(key, None) is not None and key in watched:
                watched[key].discard(worker_id)

    async def cleared(self, worker_id: str) -> None:
        self._blocks.pop(worker_id, None)
        self._unwatch(worker_id, gpu=True)

    def forget(self, worker_id: str) -> None:
        """Drop a worker that left the pool (synchronous: called from pool bookkeeping)."""
        self._blocks.pop(worker_id, None)
        self._offload.pop(worker_id, None)
        self._unwatch(worker_id, gpu=True)
        self._unwatch(worker_id, gpu=False)

    def _unwatch(self, worker_id: str, gpu: bool) -> None:
        for holders in self._holders[gpu].values():
            holders.discard(worker_id)

    def holders(self, head: BlockHash, gpu: bool = True) -> set[str]:
        """Workers holding ``head`` in the tier: one scan of the pool the first time a head
        is asked about, then kept current by the events (a bounded set of heads)."""
        key = block_key(head)
        watched = self._holders[gpu]
        found = watched.get(key)
        if found is None:
            if len(watched) >= self._max_watched:
                watched.clear()
            tier = self._blocks if gpu else self._offload
            found = watched[key] = {w for w, counts in tier.items() if key in counts}
        return found

    def match_offloaded(self, worker_id: str, chain: Sequence[BlockHash], start: int) -> int:
        """Blocks of the chain from ``start`` on (after the GPU hit) held in an offload tier:
        the engine loads them instead of computing them."""
        counts = self._offload.get(worker_id)
        if not counts:
            return 0
        for index in range(start, len(chain)):
            if block_key(chain[index]) not in counts:
                return index - start
        return len(chain) - start

    def resident(self, worker_id: str) -> frozenset[int]:
        """The worker's resident block keys (a snapshot)."""
        return frozenset(self._blocks.get(worker_id, ()))

    def count(self, worker_id: str) -> int:
        """Number of distinct resident blocks (no copy: cheap enough for every scrape)."""
        return len(self._blocks.get(worker_id, ()))

    def contains(self, worker_id: str, block_hash: BlockHash) -> bool:
        return block_key(block_hash) in self._blocks.get(worker_id, {})

    def match(self, worker_id: str, chain: Sequence[BlockHash]) -> int:
        """Leading blocks of a request's hash chain resident on the worker (its cache hit)."""
        counts = self._blocks.get(worker_id, {})
        for index, block_hash in enumerate(chain):
            if block_key(block_hash) not in counts:
                return index
        return len(chain)

    def __len__(self) -> int:
        return sum(len(counts) for counts in self._blocks.values())
