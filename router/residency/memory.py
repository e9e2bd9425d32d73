"""In-memory residency: a per-worker LRU of block hashes, the embedded single-router default."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from router.residency.base import UNIFORM, ChainShape, longest_prefix
from router.residency.blocks import BlockLRU, block_key, chain_keys, key_block


@dataclass(slots=True)
class WorkerBlocks:
    """One worker's picture, as a snapshot carries it: blocks oldest first with their
    stamps, the chain heads it holds, its capacity if one was set."""

    blocks: list[tuple[bytes, int, int]]  # (block, stamp, weight)
    heads: list[bytes] = field(default_factory=list)
    capacity: int | None = None


class MemoryResidency:
    """Records are queued and applied in one batch after the current request yields.

    ``_heads`` maps each recorded chain's first block to the workers holding it, so a match
    probes only the workers that can match at all instead of every candidate (a 1,000-worker
    pool asked about a cold prompt costs one dict lookup). A block is a chain head because
    its hash is seeded with the model (router.routing.keys), so it never appears deeper in a chain.
    Blocks are int64 keys in a ``BlockLRU`` per worker (blocks.py: ~35 bytes a block);
    capacity counts them weighted by ``shape``.
    """

    def __init__(self, default_capacity: int = 65536, shape: ChainShape = UNIFORM) -> None:
        self._default_capacity = default_capacity
        self._shape = shape
        self._capacity: dict[str, int] = {}
        # block -> stamp of its last touch (as RedisResidency scores it: microseconds minus
        # the block's index in its chain), kept in LRU order
        self._blocks: dict[str, BlockLRU] = {}
        self._heads: dict[int, set[str]] = {}  # first block of a recorded chain -> holders
        self._pending: list[tuple[str, Sequence[bytes]]] = []
        self._flush_scheduled = False

    async def match(self, chain: Sequence[bytes], worker_ids: Collection[str]) -> dict[str, int]:
        result: dict[str, int] = {}
        if not chain:
            return result
        holders = self._heads.get(block_key(chain[0]))
        if not holders:
            return result
        if len(holders) < len(worker_ids):
            wanted = worker_ids if isinstance(worker_ids, (set, frozenset)) else set(worker_ids)
            ids = [w for w in holders if w in wanted]
        else:
            ids = [w for w in worker_ids if w in holders]
        keys = chain_keys(chain)
        for worker_id in ids:
            result[worker_id] = longest_prefix(keys, self._blocks[worker_id])
        return result

    def record(self, worker_id: str, chain: Sequence[bytes]) -> None:
        if not chain:
            return
        self._pending.append((worker_id, chain))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        self._flush_scheduled = False
        for worker_id, chain in pending:
            self._apply(worker_id, chain)

    def _apply(self, worker_id: str, chain: Sequence[bytes]) -> None:
        blocks = self._blocks.get(worker_id)
        if blocks is None:
            blocks = self._blocks[worker_id] = BlockLRU()
        # touch the chain from its end so the leading blocks are the most recently used:
        # an LRU then drops tails before heads, keeping the chain's prefix property
        keys = chain_keys(chain)
        shape = self._shape
        blocks.touch_chain(keys, time.time_ns() // 1000, shape.head_blocks, shape.tail_weight)
        self._heads.setdefault(keys[0], set()).add(worker_id)
        capacity = self._capacity.get(worker_id, self._default_capacity)
        while blocks.units > capacity:
            self._evict_oldest(worker_id, blocks)

    def _evict_oldest(self, worker_id: str, blocks: BlockLRU) -> None:
        evicted = blocks.pop_oldest()
        holders = self._heads.get(evicted)
        if holders is not None:
            holders.discard(worker_id)
            if not holders:
                del self._heads[evicted]

    def stamp(self, worker_id: str, block: bytes) -> int | None:
        """When ``block`` was last touched on the worker (microseconds, minus its index)."""
        blocks = self._blocks.get(worker_id)
        return None if blocks is None else blocks.get(block)

    def drop_older(self, worker_id: str, stamp: int) -> int:
        """Drop the worker's blocks touched at or before ``stamp``: the engine evicted the
        block with that stamp, and an LRU evicts older blocks first."""
        self._flush()  # the served prompt's re-record must land first, it is newer
        blocks = self._blocks.get(worker_id)
        dropped = 0
        while blocks and blocks.oldest_stamp() <= stamp:  # type: ignore[operator]
            self._evict_oldest(worker_id, blocks)
            dropped += 1
        return dropped

    def set_capacity(self, worker_id: str, blocks: int) -> None:
        self._capacity[worker_id] = max(1, blocks)

    def forget(self, worker_id: str) -> None:
        blocks = self._blocks.pop(worker_id, None)
        self._capacity.pop(worker_id, None)
        if blocks:
            heads = self._heads
            for block in (blocks if len(blocks) < len(heads) else list(heads)):
                holders = heads.get(block)
                if holders is not None and worker_id in holders:
                    holders.discard(worker_id)
                    if not holders:
                        del heads[block]

    def resident_blocks(self, worker_id: str) -> int:
        return len(self._blocks.get(worker_id, ()))

    def links_within(self, worker_id: str, units: int) -> int:
        """How many links ``units`` of capacity hold at the worker's present mix of head
        and tail links: a store that caps by count (Redis) caps at this."""
        blocks = self._blocks.get(worker_id)
        if not blocks:
            return units
        return max(1, units * len(blocks) // blocks.units)

    def export(self) -> dict[str, WorkerBlocks]:
        """A copy of the whole picture (pending records applied), for a snapshot on disk."""
        self._flush()
        out = {w: WorkerBlocks([(key_block(k), s, n) for k, s, n in blocks.items()],
                               capacity=self._capacity.get(w))
               for w, blocks in self._blocks.items()}
        for head, holders in self._heads.items():
            for worker_id in holders:
                if worker_id in out:
                    out[worker_id].heads.append(key_block(head))
        return out

    def restore(self, workers: dict[str, WorkerBlocks]) -> None:
        """Adopt a picture from ``export`` (an earlier run's), before any request is routed."""
        for worker_id, saved in workers.items():
            if saved.capacity is not None:
                self._capacity[worker_id] = saved.capacity
            blocks = self._blocks[worker_id] = BlockLRU()
            for block, stamp, weight in saved.blocks:  # oldest first: touch order is LRU
                blocks.touch(block_key(block), stamp, weight)
            for head in saved.heads:
                self._heads.setdefault(block_key(head), set()).add(worker_id)

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        self._flush()

