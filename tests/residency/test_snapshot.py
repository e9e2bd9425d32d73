"""The residency snapshot file: what a restarted router finds is what the last one knew."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from router.residency.base import ChainShape
from router.residency.memory import MemoryResidency
from router.residency.snapshot import (
    MAGIC,
    MAGIC_V2,
    ResidencySnapshot,
    SnapshotError,
    decode,
    encode,
)

SHAPE = ChainShape(head_blocks=8, tail_weight=3)  # chains past 8 links weigh their tail


def _chain(tag: str, n: int) -> tuple[bytes, ...]:
    return tuple(f"{tag}{i:06d}".encode()[-8:].rjust(8, b"0") for i in range(n))


async def _filled() -> MemoryResidency:
    store = MemoryResidency(default_capacity=100, shape=SHAPE)
    store.set_capacity("w1", 50)
    store.record("w0", _chain("a", 10))
    store.record("w1", _chain("b", 24))  # 8 + 16 x 3 units, over w1's 50: 2 tail links go
    store.record("w0", _chain("c", 3))
    await asyncio.sleep(0)
    return store


async def test_saved_picture_matches_as_before(tmp_path: Path) -> None:
    store = await _filled()
    path = tmp_path / "sub" / "res.bin"
    await ResidencySnapshot(store, str(path), ttl_s=60).save()
    fresh = MemoryResidency(default_capacity=100, shape=SHAPE)
    assert ResidencySnapshot(fresh, str(path), ttl_s=60).load() == 2
    assert await store.match(_chain("b", 24), ["w1"]) == {"w1": 22}
    for chain in (_chain("a", 10), _chain("b", 24), _chain("c", 5), _chain("z", 4)):
        assert await fresh.match(chain, ["w0", "w1"]) == await store.match(chain, ["w0", "w1"])
    assert fresh.export() == store.export()  # stamps, weights, LRU order, heads, capacity
    fresh.record("w1", _chain("d", 1))  # capacity and weights came back: one more unit
    await asyncio.sleep(0)  # evicts the oldest tail link, 3 units
    assert fresh.resident_blocks("w1") == 22
    assert await fresh.match(_chain("b", 24), ["w1"]) == {"w1": 21}


def test_a_v2_snapshot_restores_every_block_at_weight_one() -> None:
    """v2 files (before weights) hold the same sha256 links: kept, each weighing one."""
    store = MemoryResidency(shape=SHAPE)
    store._apply("w0", _chain("a", 10))
    saved = store.export()
    weights = bytes(n for _, _, n in saved["w0"].blocks)
    assert weights == bytes([3, 3] + [1] * 8)  # oldest first: the tail goes first
    v3 = encode(saved, created=1.0)
    v2 = MAGIC_V2 + v3[len(MAGIC):].replace(weights, b"", 1)
    restored = decode(v2)[1]["w0"]
    assert [(b, s) for b, s, _ in restored.blocks] == [(b, s) for b, s, _ in saved["w0"].blocks]
    assert {n for _, _, n in restored.blocks} == {1}
    assert restored.heads == saved["w0"].heads


async def test_stale_missing_or_foreign_files_start_cold(tmp_path: Path) -> None:
    path = tmp_path / "res.bin"
    fresh = MemoryResidency()
    assert ResidencySnapshot(fresh, str(path), ttl_s=60).load() == 0  # no file yet
    store = await _filled()
    path.write_bytes(encode(store.export(), created=time.time() - 120))
    assert ResidencySnapshot(fresh, str(path), ttl_s=60).load() == 0  # older than the TTL
    path.write_bytes(b"not a snapshot")
    assert ResidencySnapshot(fresh, str(path), ttl_s=60).load() == 0
    assert fresh.export() == {}


def test_truncated_and_corrupt_files_are_refused() -> None:
    store = MemoryResidency()
    store._apply("w0", _chain("a", 4))
    data = encode(store.export(), created=1.0)
    assert decode(data)[1].keys() == {"w0"}
    for cut in (len(MAGIC) + 2, len(data) - 1):
        with pytest.raises(SnapshotError):
            decode(data[:cut])
    with pytest.raises(SnapshotError):
        decode(MAGIC + b"\x02\x00\x00\x00{]")


def test_a_snapshot_of_another_chain_hash_is_refused() -> None:
    """v1 files hold blake2b links, which no sha256 chain matches: restored, they would
    take capacity and never be hit."""
    data = encode({}, 0.0).replace(MAGIC, b"prefix-router residency v1\n", 1)
    with pytest.raises(SnapshotError):
        decode(data)
