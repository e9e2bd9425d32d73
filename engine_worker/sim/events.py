"""KV cache events as the block manager emits them (encoding lives in kv_events.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BlockStored:
    """A run of consecutive blocks of one sequence became cached."""

    block_hashes: list[bytes]
    parent_block_hash: bytes | None
    token_ids: list[int]
    block_size: int
    medium: str = "GPU"


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: list[bytes]
    medium: str = "GPU"


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared
