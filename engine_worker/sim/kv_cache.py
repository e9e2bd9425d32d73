"""Paged KV cache with vLLM v1 prefix-caching semantics.

- Fixed-size blocks; only full blocks are hashed and cached (chained hashes).
- Reference counts; a cached block whose count drops to 0 goes to the tail of the free
  queue but keeps its hash, so a later prompt can still hit it (an uncached one goes to the
  head, reused first, as in vLLM 0.32); new blocks come from the head, which
  evicts the least recently freed cached block first (a sequence's blocks are freed in
  reverse order so its tail blocks go before its head blocks, as in vLLM).
- A prompt reuses its longest cached prefix of full blocks, capped so at least one token
  is computed (vLLM needs a query token to produce logits).
- ``fork`` shares every block; appending to a shared partial last block copies it first
  (copy-on-write), which is how ``n > 1`` shares a prompt.
- When two sequences fill a block with the same content, the first one registered wins;
  the duplicate stays uncached and is plainly reused when freed (vLLM keeps both).
- ``prefix_caching=False`` hashes nothing and matches nothing (vLLM's
  ``--no-enable-prefix-caching``).
- ``allocation="contiguous"`` is the pre-paging allocator (Orca-style) the paged one is
  measured against: a sequence gets one run of consecutive blocks big enough for its
  reservation when it starts (first fit), writes into it and never grows past it; nothing
  is shared (no prefix caching, no fork). Free blocks in runs too short for a waiting
  request are its external fragmentation; reserved slots never written, its internal one.
- ``fork(copy=True)`` copies every block (the baseline against copy-on-write); copies of
  either kind are counted in ``blocks_copied``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

from engine_worker.sim.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from engine_worker.sim.hashing import BlockHasher

SeqId = Hashable


@dataclass(slots=True)
class Block:
    block_id: int
    ref_cnt: int = 0
    block_hash: bytes | None = None


@dataclass(slots=True)
class SeqBlocks:
    """The blocks of one sequence and the tokens written into them."""

    block_ids: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    hashes: list[bytes] = field(default_factory=list)  # chain hash of every full block
    reserved: list[int] = field(default_factory=list)  # contiguous mode: extent not yet written


ALLOCATIONS = ("paged", "contiguous")


class KVCacheManager:
    """Block pool + prefix cache + per-sequence block tables (single KV cache group)."""

    def __init__(self, num_blocks: int, hasher: BlockHasher,
                 listeners: Sequence[Callable[[KVEvent], None]] = (),
                 prefix_caching: bool = True, allocation: str = "paged") -> None:
        if num_blocks <= 0:
            raise ValueError("the KV cache needs at least one block")
        if allocation not in ALLOCATIONS:
            raise ValueError(f"allocation must be one of {ALLOCATIONS}, got {allocation!r}")
        self.allocation = allocation
        self.prefix_caching = prefix_caching and allocation == "paged"
        self.blocks_copied = 0  # copy-on-write copies + whole-sequence fork copies
        self.peak_used_blocks = 0
        self._extents: list[tuple[int, int]] | None = None  # contiguous mode: free runs
        self.num_blocks = num_blocks
        self.block_size = hasher.block_size
        self.hasher = hasher
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_queue: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached: dict[bytes, int] = {}
        self.seqs: dict[SeqId, SeqBlocks] = {}
        self.listeners = list(listeners)

    # -- queries -------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    def usage(self) -> float:
        """Fraction of blocks referenced by a live sequence (vLLM's kv_cache_usage_perc)."""
        return 1.0 - len(self.free_queue) / self.num_blocks

    def match(self, block_hashes: Sequence[bytes], num_tokens: int) -> list[int]:
        """Blocks of the longest cached prefix; never covers the prompt's last token."""
        if not self.prefix_caching:
            return []
        limit = (num_tokens - 1) // self.block_size
        out: list[int] = []
        for h in block_hashes[:limit]:
            bid = self.cached.get(h)
            if bid is None:
                break
            out.append(bid)
        return out

    def blocks_needed(self, seq_id: SeqId, num_new_tokens: int) -> int:
        """New blocks an append of ``num_new_tokens`` would take (copy-on-write included)."""
        seq = self.seqs[seq_id]
        bs = self.block_size
        have = len(seq.token_ids)
        need = -(-(have + num_new_tokens) // bs) - len(seq.block_ids)
        if num_new_tokens and have % bs and self.blocks[seq.block_ids[-1]].ref_cnt > 1:
            need += 1
        if seq.reserved:
            return max(0, need - len(seq.reserved))
        return need

    def can_start(self, matched: Sequence[int], num_tokens: int,
                  reserve_tokens: int = 0) -> bool:
        """Whether a new sequence reusing ``matched`` can hold ``num_tokens`` tokens (in
        contiguous mode: whether one free run holds ``reserve_tokens``)."""
        if self.allocation == "contiguous":
            return self._first_fit(self._extent_blocks(reserve_tokens)) is not None
        reserved = sum(1 for bid in matched if self.blocks[bid].ref_cnt == 0)
        need = -(-num_tokens // self.block_size) - len(matched)
        return need <= len(self.free_queue) - reserved

    def free_runs(self) -> list[tuple[int, int]]:
        """(first block id, length) of each run of consecutive free blocks, lowest first
        (contiguous mode's view of the pool; kept until a sequence starts or ends)."""
        if self._extents is None or self.allocation == "paged":
            runs: list[tuple[int, int]] = []
            prev = -2
            for bid in sorted(self.free_queue):
                if bid == prev + 1:
                    runs[-1] = (runs[-1][0], runs[-1][1] + 1)
                else:
                    runs.append((bid, 1))
                prev = bid
            self._extents = runs
        return self._extents

    def external_fragmentation(self, reserve_tokens: int) -> int:
        """Free blocks no reservation of ``reserve_tokens`` could use: those in runs too
        short for it (always 0 in paged mode, where any free block will do)."""
        if self.allocation == "paged":
            return 0
        need = self._extent_blocks(reserve_tokens)
        return sum(length for _, length in self.free_runs() if length < need)

    # -- mutations -----------------------------------------------------------------
    def start(self, seq_id: SeqId, matched: Sequence[int], token_ids: Sequence[int],
              reserve_tokens: int = 0) -> int:
        """Create a sequence on top of cached blocks holding the first tokens of
        ``token_ids``; returns the cached token count. In contiguous mode the sequence
        takes its whole reservation (``reserve_tokens``) now, in one run of blocks."""
        if seq_id in self.seqs:
            raise KeyError(f"sequence {seq_id!r} already exists")
        seq = SeqBlocks()
        if self.allocation == "contiguous":
            first = self._first_fit(self._extent_blocks(reserve_tokens))
            if first is None:
                raise RuntimeError("no free run holds the reservation (check can_start)")
            for bid in range(first, first + self._extent_blocks(reserve_tokens)):
                del self.free_queue[bid]
                self.blocks[bid].ref_cnt = 1
                seq.reserved.append(bid)
            self._extents = None
            self._note_usage()
        for bid in matched:
            blk = self.blocks[bid]
            assert blk.block_hash is not None, "matched block lost its hash"
            self._touch(blk)
            seq.block_ids.append(bid)
            seq.hashes.append(blk.block_hash)
        seq.token_ids = list(token_ids[: len(matched) * self.block_size])
        self.seqs[seq_id] = seq
        return len(seq.token_ids)

    def append(self, seq_id: SeqId, token_ids: Sequence[int],
               known_hashes: Sequence[bytes] = ()) -> bool:
        """Write tokens into the sequence's blocks; False (and no change) if blocks run out.

        ``known_hashes`` are precomputed chain hashes of the sequence's full blocks (e.g. a
        prompt's), used instead of rehashing.
        """
        if not token_ids:
            return True
        if self.blocks_needed(seq_id, len(token_ids)) > len(self.free_queue):
            return False
        seq = self.seqs[seq_id]
        bs = self.block_size
        if len(seq.token_ids) % bs and self.blocks[seq.block_ids[-1]].ref_cnt > 1:
            old = self.blocks[seq.block_ids[-1]]
            old.ref_cnt -= 1
            seq.block_ids[-1] = self._allocate().block_id
            self.blocks_copied += 1
        stored: list[tuple[int, bytes]] = []
        for tok in token_ids:
            if len(seq.token_ids) == len(seq.block_ids) * bs:
                seq.block_ids.append(seq.reserved.pop(0) if seq.reserved
                                     else self._allocate().block_id)
            seq.token_ids.append(tok)
            if len(seq.token_ids) % bs == 0 and self.prefix_caching:
                idx = len(seq.token_ids) // bs - 1
                if idx < len(known_hashes):
                    h = known_hashes[idx]
                else:
                    parent = seq.hashes[-1] if seq.hashes else None
                    h = self.hasher.hash_block(parent, seq.token_ids[idx * bs:])
                seq.hashes.append(h)
                blk = self.blocks[seq.block_ids[idx]]
                if h not in self.cached and blk.block_hash is None:
                    blk.block_hash = h
                    self.cached[h] = blk.block_id
                    stored.append((idx, h))
        self._emit_stored(seq, stored)
        return True

    def fork(self, parent: SeqId, child: SeqId, copy: bool = False) -> bool:
        """Share all of the parent's blocks with a new sequence, or (``copy``) give it a
        copy of each; False (and no change) if the copies do not fit."""
        if self.allocation == "contiguous":
            raise ValueError("contiguous allocation shares nothing: no fork")
        src = self.seqs[parent]
        if not copy:
            for bid in src.block_ids:
                self.blocks[bid].ref_cnt += 1
            block_ids = list(src.block_ids)
        else:
            if len(src.block_ids) > len(self.free_queue):
                return False
            block_ids = [self._allocate().block_id for _ in src.block_ids]
            self.blocks_copied += len(block_ids)
        self.seqs[child] = SeqBlocks(block_ids, list(src.token_ids), list(src.hashes))
        return True

    def free(self, seq_id: SeqId) -> None:
        """Release a sequence as vLLM 0.32's BlockPool.free_blocks does.

        Cached blocks go to the tail of the free queue, the sequence's tail blocks before
        its head blocks (so they are evicted first); blocks without a hash (a partial last
        block) go to the *front*, to be reused before any cached block is evicted. Queueing
        those at the tail too (as vLLM did before) evicts about one cached block per
        request too many: 2 points of prefix hit rate on a cache-bound RAG stream.
        """
        seq = self.seqs.pop(seq_id)
        uncached: list[int] = []
        for bid in reversed([*seq.block_ids, *seq.reserved]):
            blk = self.blocks[bid]
            if blk.ref_cnt <= 0:
                raise RuntimeError(f"double free of block {bid}")
            blk.ref_cnt -= 1
            if blk.ref_cnt == 0:
                if blk.block_hash is None:
                    uncached.append(bid)
                else:
                    self.free_queue[bid] = None
        for bid in reversed(uncached):  # uncached[0] ends up at the very front
            self.free_queue[bid] = None
            self.free_queue.move_to_end(bid, last=False)
        self._extents = None

    def evict(self, num_blocks: int) -> int:
        """Drop the hashes of up to ``num_blocks`` least recently used free cached blocks."""
        done = 0
        for bid in list(self.free_queue):
            if done == num_blocks:
                break
            blk = self.blocks[bid]
            if blk.block_hash is not None:
                self._uncache(blk)
                done += 1
        return done

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; only allowed when no sequence holds blocks (as vLLM)."""
        if self.seqs:
            return False
        for blk in self.blocks:
            blk.block_hash = None
        self.cached.clear()
        self._emit(AllBlocksCleared())
        return True

    # -- internals -----------------------------------------------------------------
    def _extent_blocks(self, reserve_tokens: int) -> int:
        return max(1, -(-reserve_tokens // self.block_size))

    def _first_fit(self, need: int) -> int | None:
        """First block id of the lowest free run of at least ``need`` blocks."""
        if need > len(self.free_queue):
            return None
        return next((first for first, length in self.free_runs() if length >= need), None)

    def _note_usage(self) -> None:
        used = self.num_blocks - len(self.free_queue)
        if used > self.peak_used_blocks:
            self.peak_used_blocks = used

    def _touch(self, blk: Block) -> None:
        if blk.ref_cnt == 0:
            del self.free_queue[blk.block_id]
            self._note_usage()
        blk.ref_cnt += 1

    def _allocate(self) -> Block:
        bid, _ = self.free_queue.popitem(last=False)
        blk = self.blocks[bid]
        if blk.block_hash is not None:
            self._uncache(blk)
        blk.ref_cnt = 1
        self._extents = None
        self._note_usage()
        return blk

    def _uncache(self, blk: Block) -> None:
        h = blk.block_hash
        assert h is not None
        if self.cached.get(h) == blk.block_id:
            del self.cached[h]
        blk.block_hash = None
        self._emit(BlockRemoved([h]))

    def _emit_stored(self, seq: SeqBlocks, stored: list[tuple[int, bytes]]) -> None:
        """One BlockStored per run of consecutive newly cached blocks."""
        bs = self.block_size
        run: list[tuple[int, bytes]] = []
        for item in [*stored, (-2, b"")]:
            if run and item[0] != run[-1][0] + 1:
                first = run[0][0]
                parent = seq.hashes[first - 1] if first > 0 else None
                tokens = seq.token_ids[first * bs:(run[-1][0] + 1) * bs]
                self._emit(BlockStored([h for _, h in run], parent, list(tokens), bs))
                run = []
            run.append(item)

    def _emit(self, event: KVEvent) -> None:
        for listener in self.listeners:
            listener(event)

    def publish(self, event: KVEvent) -> None:
        """An event of another tier (the CPU offload), to this cache's listeners."""
        self._emit(event)
