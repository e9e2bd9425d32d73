"""Stateful property test: the block manager against a brute-force reference model.

The reference keeps plain lists (ref count, content key, free timestamp per block) and
finds everything by linear scans; a block's content key is its whole token prefix, so it
checks the chained hashes too. Both must agree on every block id, ref count, cached
content, free-queue order and hit count.
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from engine_worker.sim.hashing import BlockHasher
from engine_worker.sim.kv_cache import KVCacheManager

BS = 4
NUM_BLOCKS = 12
BASES = [[1, 2, 1, 2, 1, 2, 1, 2, 3, 3, 3, 3], [1, 2, 1, 2, 2, 2, 2, 2], [5, 5, 5, 5]]


class Reference:
    def __init__(self) -> None:
        self.ref = [0] * NUM_BLOCKS
        self.key: list[tuple[int, ...] | None] = [None] * NUM_BLOCKS
        self.stamp = list(range(-NUM_BLOCKS, 0))
        self.clock = 0
        self.front = -NUM_BLOCKS  # stamps below every other: the free queue's front
        self.seqs: dict[int, tuple[list[int], list[int]]] = {}

    def free_count(self) -> int:
        return sum(1 for r in self.ref if r == 0)

    def find(self, key: tuple[int, ...]) -> int | None:
        hits = [b for b in range(NUM_BLOCKS) if self.key[b] == key]
        assert len(hits) <= 1
        return hits[0] if hits else None

    def alloc(self) -> int:
        b = min((b for b in range(NUM_BLOCKS) if self.ref[b] == 0), key=lambda b: self.stamp[b])
        self.key[b] = None
        self.ref[b] = 1
        return b

    def start(self, sid: int, tokens: list[int]) -> int | None:
        matched: list[int] = []
        for i in range((len(tokens) - 1) // BS):
            b = self.find(tuple(tokens[:(i + 1) * BS]))
            if b is None:
                break
            matched.append(b)
        need = -(-len(tokens) // BS) - len(matched)
        if need > self.free_count() - sum(1 for b in matched if self.ref[b] == 0):
            return None
        for b in matched:
            self.ref[b] += 1
        self.seqs[sid] = (list(matched), list(tokens[:len(matched) * BS]))
        assert self.append(sid, tokens[len(matched) * BS:])
        return len(matched) * BS

    def append(self, sid: int, toks: list[int]) -> bool:
        blocks, tokens = self.seqs[sid]
        cow = bool(toks) and len(tokens) % BS != 0 and self.ref[blocks[-1]] > 1
        need = -(-(len(tokens) + len(toks)) // BS) - len(blocks) + int(cow)
        if need > self.free_count():
            return False
        if cow:
            self.ref[blocks[-1]] -= 1
            blocks[-1] = self.alloc()
        for t in toks:
            if len(tokens) == len(blocks) * BS:
                blocks.append(self.alloc())
            tokens.append(t)
            if len(tokens) % BS == 0:
                key = tuple(tokens)
                if self.find(key) is None and self.key[blocks[-1]] is None:
                    self.key[blocks[-1]] = key
        return True

    def fork(self, sid: int, child: int) -> None:
        blocks, tokens = self.seqs[sid]
        for b in blocks:
            self.ref[b] += 1
        self.seqs[child] = (list(blocks), list(tokens))

    def free(self, sid: int) -> None:
        """vLLM 0.32: cached blocks to the tail (tail blocks first), uncached to the front."""
        blocks, _ = self.seqs.pop(sid)
        uncached = []
        for b in reversed(blocks):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                if self.key[b] is None:
                    uncached.append(b)
                else:
                    self.stamp[b] = self.clock
                    self.clock += 1
        for b in reversed(uncached):
            self.front -= 1
            self.stamp[b] = self.front

    def evict(self, k: int) -> int:
        free = sorted((b for b in range(NUM_BLOCKS) if self.ref[b] == 0 and self.key[b]),
                      key=lambda b: self.stamp[b])
        for b in free[:k]:
            self.key[b] = None
        return len(free[:k])


class BlockManagerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.sut = KVCacheManager(NUM_BLOCKS, BlockHasher(BS, "sha256_cbor", seed="0"))
        self.ref = Reference()
        self.next_id = 0
        self.hits_sut = 0
        self.hits_ref = 0

    def _live(self) -> list[int]:
        return sorted(self.ref.seqs)

    @rule(base=st.sampled_from(BASES), cut=st.integers(1, 12),
          suffix=st.lists(st.integers(1, 3), max_size=6))
    def allocate(self, base: list[int], cut: int, suffix: list[int]) -> None:
        tokens = base[:cut] + suffix
        sid = self.next_id
        self.next_id += 1
        hashes = self.sut.hasher.chain(tokens)
        matched = self.sut.match(hashes, len(tokens))
        expected = self.ref.start(sid, tokens)
        assert self.sut.can_start(matched, len(tokens)) == (expected is not None)
        if expected is None:
            return
        cached = self.sut.start(sid, matched, tokens)
        assert self.sut.append(sid, tokens[cached:], hashes)
        assert cached == expected
        self.hits_sut += cached
        self.hits_ref += expected

    @precondition(lambda self: self.ref.seqs)
    @rule(data=st.data(), tok=st.integers(1, 3))
    def append(self, data: st.DataObject, tok: int) -> None:
        sid = data.draw(st.sampled_from(self._live()))
        assert self.sut.append(sid, [tok]) == self.ref.append(sid, [tok])

    @precondition(lambda self: self.ref.seqs)
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(self._live()))
        child = self.next_id
        self.next_id += 1
        self.sut.fork(sid, child)
        self.ref.fork(sid, child)

    @precondition(lambda self: self.ref.seqs)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(self._live()))
        self.sut.free(sid)
        self.ref.free(sid)

    @rule(k=st.integers(0, 4))
    def evict(self, k: int) -> None:
        assert self.sut.evict(k) == self.ref.evict(k)

    @invariant()
    def agree(self) -> None:
        sut, ref = self.sut, self.ref
        assert [b.ref_cnt for b in sut.blocks] == ref.ref
        assert [b.block_hash is not None for b in sut.blocks] == [k is not None for k in ref.key]
        for sid, (blocks, tokens) in ref.seqs.items():
            assert sut.seqs[sid].block_ids == blocks
            assert sut.seqs[sid].token_ids == tokens
        assert set(sut.seqs) == set(ref.seqs)
        # No leaks or double frees: every block is either free or referenced, never both,
        # and ref counts equal the number of block-table entries pointing at the block.
        counts = [0] * NUM_BLOCKS
        for seq in sut.seqs.values():
            for b in seq.block_ids:
                counts[b] += 1
        assert counts == ref.ref
        free_order = sorted((b for b in range(NUM_BLOCKS) if ref.ref[b] == 0),
                            key=lambda b: ref.stamp[b])
        assert list(sut.free_queue) == free_order
        # Cached hashes are exactly the chained hashes of the reference's content keys.
        expected = {sut.hasher.chain(list(k))[-1]: b for b, k in enumerate(ref.key) if k}
        assert sut.cached == expected
        assert self.hits_sut == self.hits_ref


BlockManagerMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestBlockManager = BlockManagerMachine.TestCase
