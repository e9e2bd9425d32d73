"""The KV manager's baseline modes: contiguous reservation, no prefix caching, fork copies."""

from __future__ import annotations

import pytest

from engine_worker.sim.hashing import BlockHasher
from engine_worker.sim.kv_cache import KVCacheManager


def contiguous(num_blocks: int) -> KVCacheManager:
    return KVCacheManager(num_blocks, BlockHasher(16, seed="0"), allocation="contiguous")


def test_a_contiguous_sequence_takes_one_run_of_its_whole_reservation_up_front() -> None:
    kv = contiguous(20)
    assert kv.can_start([], 10, reserve_tokens=100)
    kv.start("a", [], list(range(10)), reserve_tokens=100)  # 7 blocks reserved
    assert kv.num_free_blocks == 13
    assert kv.append("a", list(range(10)))
    assert kv.seqs["a"].block_ids == [0] and kv.seqs["a"].reserved == [1, 2, 3, 4, 5, 6]
    assert kv.append("a", list(range(90)))  # grows inside its reservation: no new block
    assert kv.num_free_blocks == 13 and kv.seqs["a"].block_ids == list(range(7))
    kv.free("a")
    assert kv.num_free_blocks == 20 and kv.free_runs() == [(0, 20)]


def test_free_blocks_in_runs_too_short_are_external_fragmentation() -> None:
    kv = contiguous(12)
    for sid in "abc":
        kv.start(sid, [], [1], reserve_tokens=64)  # 4 blocks each: 0-3, 4-7, 8-11
    kv.free("a")
    kv.free("c")
    assert kv.num_free_blocks == 8
    assert not kv.can_start([], 1, reserve_tokens=16 * 6)  # 8 free, but no run of 6
    assert kv.external_fragmentation(16 * 6) == 8
    assert kv.external_fragmentation(16 * 4) == 0
    paged = KVCacheManager(12, BlockHasher(16, seed="0"))
    assert paged.external_fragmentation(16 * 6) == 0


def test_contiguous_mode_shares_nothing() -> None:
    kv = contiguous(40)
    prompt = list(range(64))
    kv.start("a", [], prompt, reserve_tokens=128)
    kv.append("a", prompt)
    assert kv.match(kv.hasher.chain(prompt), 65) == []
    with pytest.raises(ValueError):
        kv.fork("a", "b")


def test_without_prefix_caching_nothing_is_matched() -> None:
    kv = KVCacheManager(40, BlockHasher(16, seed="0"), prefix_caching=False)
    prompt = list(range(64))
    kv.start("a", [], prompt)
    kv.append("a", prompt)
    kv.free("a")
    assert kv.match(kv.hasher.chain(prompt), 65) == [] and not kv.cached


def test_a_copying_fork_copies_every_block_and_copy_on_write_one() -> None:
    kv = KVCacheManager(40, BlockHasher(16, seed="0"))
    kv.start("a", [], list(range(40)))
    kv.append("a", list(range(40)))  # 3 blocks, the last one partial
    kv.fork("a", "copy", copy=True)
    assert kv.blocks_copied == 3 and kv.num_free_blocks == 34
    kv.fork("a", "shared")
    assert kv.append("shared", [7])  # writes into the shared partial block: copied first
    assert kv.blocks_copied == 4 and kv.peak_used_blocks == 7
