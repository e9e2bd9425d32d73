"""BlockLRU behaves exactly as the OrderedDict it replaces (touch order, stamps, eviction)."""

from __future__ import annotations

from collections import OrderedDict

from hypothesis import given, settings
from hypothesis import strategies as st

from router.residency.blocks import BlockLRU, block_key, chain_keys, key_block

# few distinct keys, several sharing low bits, so probes collide and deletions shift
KEYS = st.sampled_from([k * 64 + j for k in range(-3, 4) for j in (0, 1, 2)])
ops = st.lists(st.one_of(st.tuples(st.just("touch"), st.lists(KEYS, max_size=40),
                                   st.integers(-5, 50), st.integers(0, 40)),
                         st.tuples(st.just("pop"), st.just([]), st.just(0), st.just(0))),
               min_size=1, max_size=300)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_block_lru_is_an_ordered_dict(script: list) -> None:
    """A chain is touched from its end, link i stamped ``now - i`` (repeats included); a
    link first inserted at index ``tail_from`` or later weighs 5, and ``units`` sums them."""
    lru, model, weights = BlockLRU(), OrderedDict[int, int](), dict[int, int]()
    for op, keys, now, tail_from in script:
        if op == "touch":
            lru.touch_chain(keys, now, tail_from, 5)
            for link in range(len(keys) - 1, -1, -1):
                if keys[link] not in model:
                    weights[keys[link]] = 5 if link >= tail_from else 1
                model[keys[link]] = now - link
                model.move_to_end(keys[link])
        elif model:
            key = model.popitem(last=False)[0]
            assert lru.pop_oldest() == key
            del weights[key]
        assert len(lru) == len(model)
        assert lru.units == sum(weights.values())
        assert lru.oldest_stamp() == (next(iter(model.values())) if model else None)
        for k in range(-3 * 64, 4 * 64 + 3):
            assert (k in lru) == (k in model)
            assert lru.get(k) == model.get(k)
    assert sorted(lru) == sorted(model)
    assert lru.items() == [(k, stamp, weights[k]) for k, stamp in model.items()]


def test_many_blocks_survive_growth_and_log_compaction() -> None:
    lru = BlockLRU()
    for i in range(20_000):
        lru.touch_chain([i * 7919], i)
        if i % 3 == 0:
            lru.touch_chain([0], i)  # one hot block, re-touched: dead log slots to compact
    lru.touch_chain([k * 104_729 for k in range(1, 5_000)], 20_000)  # one long chain
    assert len(lru) == 20_000 + 4_999
    while len(lru) > 100:
        lru.pop_oldest()
    assert 104_729 in lru and (100 * 104_729) in lru and (101 * 104_729) not in lru and 0 not in lru
    assert len(lru) == 100
    assert lru.get(104_729) == 20_000  # the chain's head, most recently used


def test_chain_links_become_int64_keys() -> None:
    links = [bytes([i]) * 8 for i in range(3)]
    assert chain_keys(links) == [block_key(b) for b in links]
    assert block_key(b"\xff" * 8) == -1
    assert all(key_block(block_key(b)) == b for b in links)
    assert chain_keys([b"short", b"x" * 8]) == [block_key(b"short"), block_key(b"x" * 8)]
