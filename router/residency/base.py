"""The residency interface shared by the in-memory and the Redis store."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class ChainShape:
    """How much KV a chain link stands for, in head blocks: the first ``head_blocks`` links
    are one block of the chain's block size each, later ones (routing/keys.py's tail)
    ``tail_weight`` blocks each. Capacity counts these units: counted as one each, a
    120 k-token prompt's 4 KB tail links took a sixteenth of the room they hold on the
    engine, and the picture kept long-evicted histories warm (offline Mooncake: the
    picture 50-85 % full while every engine was full). The default weighs every link
    alike."""

    head_blocks: int = 1 << 30
    tail_weight: int = 1


UNIFORM = ChainShape()  # every link one block: stores built without a shape (tests, tools)


class ResidencyStore(Protocol):
    """Chains are sequences of block hashes; residency is monotone along a chain."""

    async def match(self, chain: Sequence[bytes], worker_ids: Collection[str]) -> dict[str, int]:
        """Longest resident prefix of ``chain`` (in blocks) per worker that holds any of it;
        one round trip at most."""
        ...

    def record(self, worker_id: str, chain: Sequence[bytes]) -> None:
        """Note that worker now holds chain warm; must not block (writes are batched)."""
        ...

    def set_capacity(self, worker_id: str, blocks: int) -> None:
        """Cap a worker's tracked blocks (head blocks: ``ChainShape``) so the picture
        mirrors the engine's LRU."""
        ...

    def stamp(self, worker_id: str, block: bytes) -> int | None:
        """An LRU position of ``block`` on the worker, to hand back to ``drop_older``."""
        ...

    def drop_older(self, worker_id: str, stamp: int) -> int:
        """The engine evicted the block stamped ``stamp``: drop it and everything older."""
        ...

    def forget(self, worker_id: str) -> None:
        """Drop a removed worker's blocks."""
        ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...


def longest_prefix(chain: Sequence[bytes] | Sequence[int], resident: object) -> int:
    """Binary search for the longest leading run of chain found in ``resident`` (``in``)."""
    lo, hi = 0, len(chain)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if chain[mid - 1] in resident:  # type: ignore[operator]
            lo = mid
        else:
            hi = mid - 1
    return lo
