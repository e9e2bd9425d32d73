"""An LMCache-like CPU tier: GPU-evicted blocks land in an LRU pool in host memory.

Only block hashes are tracked (contents are simulated). A prefix found here is loaded
back over PCIe instead of being recomputed; the engine charges the transfer time.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from engine_worker.sim.events import BlockRemoved, KVEvent


class CpuTier:
    def __init__(self, capacity_blocks: int) -> None:
        self.capacity_blocks = capacity_blocks
        self._lru: OrderedDict[bytes, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._lru)

    def on_gpu_event(self, event: KVEvent) -> None:
        """Listener for the GPU cache: an evicted block is offloaded here."""
        if isinstance(event, BlockRemoved) and event.medium == "GPU":
            for h in event.block_hashes:
                self.put(h)

    def put(self, block_hash: bytes) -> None:
        if self.capacity_blocks <= 0:
            return
        self._lru[block_hash] = None
        self._lru.move_to_end(block_hash)
        while len(self._lru) > self.capacity_blocks:
            self._lru.popitem(last=False)

    def match(self, block_hashes: Sequence[bytes]) -> int:
        """How many leading hashes are held here (and refresh them as recently used)."""
        n = 0
        for h in block_hashes:
            if h not in self._lru:
                break
            self._lru.move_to_end(h)
            n += 1
        return n
