"""An LMCache-like CPU tier: GPU-evicted blocks land in an LRU pool in host memory.

Only block hashes are tracked (contents are simulated). A prefix found here is loaded
back over PCIe instead of being recomputed; the engine charges the transfer time. Like
LMCache's offload events, a block entering or leaving the tier is published as a KV event
with ``medium="CPU"``, so a router can weigh a CPU-resident prefix (cheaper than a cold
one, dearer than one in GPU memory).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

from engine_worker.sim.events import BlockRemoved, BlockStored, KVEvent

CPU = "CPU"


class CpuTier:
    def __init__(self, capacity_blocks: int, block_size: int = 16,
                 emit: Callable[[KVEvent], None] | None = None) -> None:
        self.capacity_blocks = capacity_blocks
        self.block_size = block_size
        self.emit = emit  # where this tier's own events go (the engine's KV listeners)
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
        new = block_hash not in self._lru
        self._lru[block_hash] = None
        self._lru.move_to_end(block_hash)
        evicted = []
        while len(self._lru) > self.capacity_blocks:
            evicted.append(self._lru.popitem(last=False)[0])
        if self.emit is not None:
            if new:
                self.emit(BlockStored([block_hash], None, [], self.block_size, CPU))
            if evicted:
                self.emit(BlockRemoved(evicted, CPU))

    def match(self, block_hashes: Sequence[bytes]) -> int:
        """How many leading hashes are held here (and refresh them as recently used)."""
        n = 0
        for h in block_hashes:
            if h not in self._lru:
                break
            self._lru.move_to_end(h)
            n += 1
        return n
