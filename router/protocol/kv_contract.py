"""What a worker's KV events say, as router and workers both read them: block hashes in
vLLM's int form, and the sink that receives one worker's cache changes in order."""

from __future__ import annotations

from typing import Protocol

BlockHash = int | bytes
LOW_64 = (1 << 64) - 1


def block_key(block_hash: BlockHash) -> int:
    """vLLM's int form of a block hash: bytes -> low 64 bits, big-endian (as vLLM does)."""
    if isinstance(block_hash, bytes | bytearray):
        return int.from_bytes(block_hash, "big") & LOW_64
    return int(block_hash) & LOW_64


GPU_MEDIA: frozenset[str | None] = frozenset({"GPU", None})  # vLLM's own cache
ALL_MEDIA: frozenset[str | None] = frozenset({"GPU", None, "CPU", "CPU_PINNED", "DISK",
                                              "LOCAL_DISK", "REMOTE"})  # offload tiers too


class ResidencySink(Protocol):
    """Receives one worker's cache changes, in the order the worker made them. ``medium``
    is the event's tier (None or "GPU": vLLM's own cache; "CPU", "DISK", ...: offload)."""

    async def stored(self, worker_id: str, block_hashes: list[BlockHash],
                     medium: str | None = None) -> None: ...

    async def removed(self, worker_id: str, block_hashes: list[BlockHash],
                      medium: str | None = None) -> None: ...

    async def cleared(self, worker_id: str) -> None: ...
