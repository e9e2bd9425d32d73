"""BlockLRU behaves exactly as the OrderedDict it replaces (touch order, stamps, eviction)."""

from __future__ import annotations

from collections import OrderedDict

from hypothesis import given, settings
from hypothesis import strategies as st

from router.residency.blocks import BlockLRU, block_key, chain_keys, key_block

# few distinct keys, several sharing low bits, so probes collide and deletions shift
KEYS = st.sampled_from([k * 64 + j for k in range(-3, 4) for j in (0, 1, 2)])
ops = st.lists(st.one_of(st.tuples(st.just("touch"), KEYS, st.integers(-5, 50)),
                         st.tuples(st.just("pop"), st.just(0), st.just(0))),
               min_size=1, max_size=300)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_block_lru_is_an_ordered_dict(script: list) -> None:
    lru, model = BlockLRU(), OrderedDict[int, int]()
    for op, key, stamp in script:
        if op == "touch":
            lru.touch(key, stamp)
            model[key] = stamp
            model.move_to_end(key)
        elif model:
            assert lru.pop_oldest() == model.popitem(last=False)[0]
        assert len(lru) == len(model)
        assert lru.oldest_stamp() == (next(iter(model.values())) if model else None)
        for k in range(-3 * 64, 4 * 64 + 3):
            assert (k in lru) == (k in model)
            assert lru.get(k) == model.get(k)
    assert sorted(lru) == sorted(model)
    assert lru.items() == list(model.items())


def test_many_blocks_survive_growth_and_log_compaction() -> None:
    lru = BlockLRU()
    for i in range(20_000):
        lru.touch(i * 7919, i)
        if i % 3 == 0:
            lru.touch(0, i)  # one hot block, re-touched: dead log slots to compact
    while len(lru) > 100:
        lru.pop_oldest()
    assert 0 in lru and (19_999 * 7919) in lru and (19_000 * 7919) not in lru
    assert len(lru) == 100


def test_chain_links_become_int64_keys() -> None:
    links = [bytes([i]) * 8 for i in range(3)]
    assert chain_keys(links) == [block_key(b) for b in links]
    assert block_key(b"\xff" * 8) == -1
    assert all(key_block(block_key(b)) == b for b in links)
    assert chain_keys([b"short", b"x" * 8]) == [block_key(b"short"), block_key(b"x" * 8)]
