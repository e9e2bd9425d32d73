"""In-memory residency: a per-worker LRU of block hashes, the embedded single-router default."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Sequence

from router.residency.base import longest_prefix


class MemoryResidency:
    """Records are queued and applied in one batch after the current request yields."""

    def __init__(self, default_capacity: int = 65536) -> None:
        self._default_capacity = default_capacity
        self._capacity: dict[str, int] = {}
        self._blocks: dict[str, OrderedDict[bytes, None]] = {}
        self._pending: list[tuple[str, Sequence[bytes]]] = []
        self._flush_scheduled = False

    async def match(self, chain: Sequence[bytes], worker_ids: Sequence[str]) -> dict[str, int]:
        result: dict[str, int] = {}
        if not chain:
            return result
        for worker_id in worker_ids:
            blocks = self._blocks.get(worker_id)
            if blocks and chain[0] in blocks:
                result[worker_id] = longest_prefix(chain, blocks)
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
        blocks = self._blocks.setdefault(worker_id, OrderedDict())
        # touch the chain from its end so the leading blocks are the most recently used:
        # an LRU then drops tails before heads, keeping the chain's prefix property
        for block in reversed(chain):
            blocks[block] = None
            blocks.move_to_end(block)
        capacity = self._capacity.get(worker_id, self._default_capacity)
        while len(blocks) > capacity:
            blocks.popitem(last=False)

    def set_capacity(self, worker_id: str, blocks: int) -> None:
        self._capacity[worker_id] = max(1, blocks)

    def forget(self, worker_id: str) -> None:
        self._blocks.pop(worker_id, None)
        self._capacity.pop(worker_id, None)

    def resident_blocks(self, worker_id: str) -> int:
        return len(self._blocks.get(worker_id, ()))

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        self._flush()
