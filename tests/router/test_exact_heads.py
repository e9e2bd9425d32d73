"""Precise mode asks only the workers holding the chain head, and answers as probing all did."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from router.precise.exact import ExactResidency
from router.precise.matcher import PreciseMatcher

IDS = ["w0", "w1", "w2", "w3"]
CHAINS = [[1, 2, 3, 4], [1, 2, 7], [5, 6], [5, 8, 9]]
ops = st.lists(st.tuples(st.sampled_from(["stored", "removed", "cleared", "forget"]),
                         st.integers(0, 3), st.lists(st.integers(1, 9), max_size=4),
                         st.sampled_from([None, "GPU", "CPU"])), min_size=1, max_size=40)


@settings(max_examples=150, deadline=None)
@given(ops, st.integers(1, 3))
def test_head_index_matches_probing_every_worker(script: list, watched: int) -> None:
    async def go() -> None:
        res = ExactResidency(max_watched=watched)  # tiny: the index is dropped and rebuilt
        matcher = PreciseMatcher({}, SimpleNamespace(residency=res), 16, 4)  # type: ignore[arg-type]
        for op, w, blocks, medium in script:
            if op in ("stored", "removed"):
                await getattr(res, op)(IDS[w], blocks, medium)
            elif op == "cleared":
                await res.cleared(IDS[w])
            else:
                res.forget(IDS[w])
            for chain in CHAINS:
                for ids in (IDS, IDS[:2]):
                    gpu = {w: n for w in ids if (n := res.match(w, chain))}
                    assert matcher.match(chain, ids) == gpu  # type: ignore[arg-type]
                    off = {w: n for w in ids
                           if (n := res.match_offloaded(w, chain, gpu.get(w, 0)))}
                    assert matcher.offloaded(chain, gpu, ids) == off  # type: ignore[arg-type]

    asyncio.run(go())
