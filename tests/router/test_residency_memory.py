"""MemoryResidency's chain-head index gives exactly what probing every candidate gave."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from router.residency.base import ChainShape, longest_prefix
from router.residency.memory import MemoryResidency
from router.routing.keys import prompt_key

IDS = [f"w{i}" for i in range(5)]


def chain_of(prefix: int, doc: int, n_blocks: int) -> tuple[bytes, ...]:
    """Prompts sharing ``prefix`` share leading blocks; ``doc`` makes the rest differ."""
    text = (f"system{prefix} " * 8 + f"doc{doc} " * 12 * n_blocks).encode()
    return prompt_key(text, "m", 64, 64, 8).chain[:n_blocks]


def probe_all(res: MemoryResidency, chain: Sequence[bytes], ids: Sequence[str]) -> dict[str, int]:
    """The previous algorithm: every candidate whose LRU holds the head, binary searched."""
    out = {}
    for w in ids:
        blocks = res._blocks.get(w)
        if blocks and chain and chain[0] in blocks:
            out[w] = longest_prefix(chain, blocks)
    return out


ops = st.lists(st.tuples(st.sampled_from(["record", "forget", "capacity"]),
                         st.integers(0, 4), st.integers(0, 2), st.integers(0, 5),
                         st.integers(1, 12)), min_size=1, max_size=40)


@settings(max_examples=150, deadline=None)
@given(ops, st.integers(2, 40))
def test_head_index_matches_probing_every_candidate(script: list, capacity: int) -> None:
    async def go() -> None:
        res = MemoryResidency(default_capacity=capacity)
        for op, w, prefix, doc, n in script:
            if op == "record":
                res.record(IDS[w], chain_of(prefix, doc, n))
            elif op == "forget":
                res.forget(IDS[w])
            else:
                res.set_capacity(IDS[w], n)
            await asyncio.sleep(0)  # apply the batch
            for prefix_q in range(3):
                for doc_q in range(6):
                    chain = chain_of(prefix_q, doc_q, 12)
                    for ids in (IDS, IDS[:2], IDS[3:]):
                        assert await res.match(chain, ids) == probe_all(res, chain, ids)
        # the index holds no worker that no longer holds the head
        for head, holders in res._heads.items():
            assert holders and all(head in res._blocks[w] for w in holders)

    asyncio.run(go())


async def test_cold_prompt_probes_no_worker() -> None:
    res = MemoryResidency()
    for i in range(1000):
        res.record(f"w{i}", chain_of(i, i, 4))
    await asyncio.sleep(0)
    ids = [f"w{i}" for i in range(1000)]
    assert await res.match(chain_of(5000, 1, 4), ids) == {}
    assert await res.match(chain_of(7, 7, 4), ids) == {"w7": 4}
    assert await res.match(chain_of(7, 8, 4), ids) == {"w7": 1}  # shares the system block


async def test_capacity_counts_tail_links_by_their_weight() -> None:
    """A chain's tail links stand for ``tail_weight`` head blocks each (routing/keys.py):
    three chains of 10 head + 5 tail links of weight 4 fill 90 of 100 units; a fourth
    evicts the oldest chain's tail, which counted as one block each would have fit."""
    def long_chain(doc: int) -> tuple[bytes, ...]:
        return prompt_key((f"doc{doc} " * 1200).encode(), "m", 64, 10, 8).chain[:15]

    res = MemoryResidency(default_capacity=100, shape=ChainShape(head_blocks=10, tail_weight=4))
    uniform = MemoryResidency(default_capacity=100)
    for doc in range(4):
        res.record("w0", long_chain(doc))
        uniform.record("w0", long_chain(doc))
        await asyncio.sleep(0)
    assert await res.match(long_chain(0), ["w0"]) == {"w0": 10}  # its 5 tail links: 20 units
    assert [await res.match(long_chain(d), ["w0"]) for d in (1, 2, 3)] == [{"w0": 15}] * 3
    assert await uniform.match(long_chain(0), ["w0"]) == {"w0": 15}  # 60 links of 100
