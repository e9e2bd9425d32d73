"""Offline upper bounds on the prefix hit rate, in the simulator's own block terms.

The fleet's hit rate (Σ hits / Σ queries, in tokens) is bounded by what one cache that
saw every request could have hit: with unbounded capacity (no router and no cache size
can beat it), and as one LRU as large as the whole fleet's (what perfect partitioning
of the same total memory could reach). Both follow the simulator's rules: 16-token
blocks, chained hashes, only full blocks cached, at least one prompt token recomputed,
a finished sequence's blocks freed tail-first into the LRU. They ignore the blocks that
running sequences and generated tokens occupy, so they are (slightly) optimistic.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from bench.workloads.base import BenchRequest


@dataclass(frozen=True, slots=True)
class Bounds:
    unbounded_hit_rate: float
    fleet_lru_hit_rate: float
    worker_lru_hit_rate: float  # one worker's cache seeing all traffic
    working_set_blocks: int  # distinct full blocks in the request sequence
    prompt_tokens: int
    fleet_blocks: int
    worker_blocks: int

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def prompt_chain(prompt: str, block_size: int = 16) -> list[int]:
    """Chained ids of the prompt's full token blocks (text.py: one word = one token)."""
    toks = prompt.split(" ")[1:] if prompt.startswith(" ") else prompt.split(" ")
    chain: list[int] = []
    parent = 0
    for i in range(len(toks) // block_size):
        parent = hash((parent, tuple(toks[i * block_size:(i + 1) * block_size])))
        chain.append(parent)
    return chain


def _cacheable(n_tokens: int, cached_blocks: int, block_size: int) -> int:
    """Hit tokens: the cached run, keeping at least one token to compute (as vLLM does)."""
    return min(cached_blocks, (n_tokens - 1) // block_size) * block_size


def lru_hit_rate(chains: Sequence[Sequence[int]], lengths: Sequence[int], capacity: int | None,
                 block_size: int = 16) -> float:
    """Token hit rate of one LRU cache of ``capacity`` blocks (None: unbounded)."""
    cache: OrderedDict[int, None] = OrderedDict()
    hits = queries = 0
    for chain, n in zip(chains, lengths, strict=True):
        run = 0
        for block in chain:
            if block not in cache:
                break
            run += 1
        hits += _cacheable(n, run, block_size)
        queries += n
        for block in reversed(chain):  # leading blocks most recent: tails are evicted first
            cache[block] = None
            cache.move_to_end(block)
        if capacity is not None:
            while len(cache) > capacity:
                cache.popitem(last=False)
    return hits / queries if queries else 0.0


def compute(requests: Sequence[BenchRequest], worker_blocks: int, workers: int,
            block_size: int = 16) -> Bounds:
    chains = [prompt_chain(r.prompt, block_size) for r in requests]
    lengths = [r.prompt_tokens for r in requests]
    distinct = len({b for c in chains for b in c})
    return Bounds(
        unbounded_hit_rate=lru_hit_rate(chains, lengths, None, block_size),
        fleet_lru_hit_rate=lru_hit_rate(chains, lengths, worker_blocks * workers, block_size),
        worker_lru_hit_rate=lru_hit_rate(chains, lengths, worker_blocks, block_size),
        working_set_blocks=distinct, prompt_tokens=sum(lengths),
        fleet_blocks=worker_blocks * workers, worker_blocks=worker_blocks)


def trace_block_hit_rate(hash_id_lists: Iterable[Sequence[int]]) -> float:
    """Share of trace blocks that are prefix hits in one unbounded cache (README: 36.6 %)."""
    seen: set[tuple[int, int]] = set()
    hits = total = 0
    for ids in hash_id_lists:
        parent = -1
        run_open = True
        for hid in ids:
            key = (parent, hid)
            if run_open and key in seen:
                hits += 1
            else:
                run_open = False
            seen.add(key)
            parent = hash(key)
        total += len(ids)
    return hits / total if total else 0.0
