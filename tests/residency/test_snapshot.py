"""The residency snapshot file: what a restarted router finds is what the last one knew."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from router.residency.memory import MemoryResidency
from router.residency.snapshot import MAGIC, ResidencySnapshot, SnapshotError, decode, encode


def _chain(tag: str, n: int) -> tuple[bytes, ...]:
    return tuple(f"{tag}{i:06d}".encode()[-8:].rjust(8, b"0") for i in range(n))


async def _filled() -> MemoryResidency:
    store = MemoryResidency(default_capacity=100)
    store.set_capacity("w1", 50)
    store.record("w0", _chain("a", 10))
    store.record("w1", _chain("b", 60))  # over w1's capacity: its oldest ten are evicted
    store.record("w0", _chain("c", 3))
    await asyncio.sleep(0)
    return store


async def test_saved_picture_matches_as_before(tmp_path: Path) -> None:
    store = await _filled()
    path = tmp_path / "sub" / "res.bin"
    await ResidencySnapshot(store, str(path), ttl_s=60).save()
    fresh = MemoryResidency(default_capacity=100)
    assert ResidencySnapshot(fresh, str(path), ttl_s=60).load() == 2
    for chain in (_chain("a", 10), _chain("b", 60), _chain("c", 5), _chain("z", 4)):
        assert await fresh.match(chain, ["w0", "w1"]) == await store.match(chain, ["w0", "w1"])
    assert fresh.export() == store.export()  # stamps, LRU order, heads and capacity too
    fresh.record("w1", _chain("d", 1))  # capacity came back: w1 still holds 50
    await asyncio.sleep(0)
    assert fresh.resident_blocks("w1") == 50


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
