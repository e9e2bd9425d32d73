"""Hand-checked prefix-cache cases that follow vLLM v1's rules."""

from __future__ import annotations

from engine_worker.sim.hashing import BlockHasher
from engine_worker.sim.kv_cache import KVCacheManager


def run(kv: KVCacheManager, sid: str, tokens: list[int], keep: bool = False) -> int:
    hashes = kv.hasher.chain(tokens)
    matched = kv.match(hashes, len(tokens))
    assert kv.can_start(matched, len(tokens))
    cached = kv.start(sid, matched, tokens)
    assert kv.append(sid, tokens[cached:], hashes)
    if not keep:
        kv.free(sid)
    return cached


def make(num_blocks: int = 1000) -> KVCacheManager:
    return KVCacheManager(num_blocks, BlockHasher(16, seed="0"))


def test_repeated_prompt_hits_whole_blocks_but_recomputes_last_token() -> None:
    kv = make()
    prompt = list(range(1, 1001))
    assert run(kv, "a", prompt) == 0
    assert run(kv, "b", prompt) == 992
    longer = list(range(1, 1025))
    assert run(kv, "c", longer) == 992   # block 62 was partial in the 1,000-token prompt
    assert run(kv, "d", longer) == 1008  # 1,024 tokens: 64 blocks, last one recomputed


def test_shared_prefix_then_different_tokens_hits_the_shared_part() -> None:
    kv = make()
    run(kv, "a", list(range(1, 1001)))
    assert run(kv, "b", list(range(1, 961)) + [7] * 40) == 960


def test_least_recently_used_free_block_is_evicted_first() -> None:
    kv = make(num_blocks=4)
    old, new = [1] * 32, [2] * 32   # two blocks each
    run(kv, "old", old)
    run(kv, "new", new)
    run(kv, "third", [3] * 32)     # needs 2 blocks: evicts old's two, keeps new's
    assert run(kv, "probe-new", [*new, 9]) == 32
    assert run(kv, "probe-old", [*old, 9]) == 0


def test_tail_blocks_of_a_sequence_are_evicted_before_its_head() -> None:
    kv = make(num_blocks=4)
    run(kv, "a", list(range(1, 65)))          # 4 full blocks, freed tail first
    run(kv, "b", [99] * 16)                   # one new block: evicts a's last block
    hashes = kv.hasher.chain(list(range(1, 65)))
    assert [h in kv.cached for h in hashes] == [True, True, True, False]


def test_fork_shares_blocks_and_copies_partial_block_on_write() -> None:
    kv = make(num_blocks=10)
    run(kv, "p", list(range(1, 21)), keep=True)   # 1 full + 1 partial block
    kv.fork("p", "c")
    shared = kv.seqs["p"].block_ids
    assert [kv.blocks[b].ref_cnt for b in shared] == [2, 2]
    assert kv.append("c", [7])
    assert kv.seqs["c"].block_ids[0] == shared[0]
    assert kv.seqs["c"].block_ids[1] != shared[1]
    assert [kv.blocks[b].ref_cnt for b in shared] == [2, 1]
    kv.free("p")
    kv.free("c")
    assert kv.num_free_blocks == 10
