"""Precise routing decisions: prompt -> vLLM block hashes -> exact per-worker cache hits.

A request is routed precisely when its model has a local tokenizer and every candidate
worker has a KV-event feed with the same block size and hash seed (hashes computed with
different parameters can't be compared); otherwise ``key`` returns None and the router
uses the approximate text chain. The routing key is anchored like the text one
(router/routing/keys.py ``anchor``: the chain link at block min(n, key_blocks)), so the
policies' ring and warm-ratio logic apply unchanged, only with exact matches.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from router.fleet.workers import Worker
from router.precise.exact import ExactResidency, block_key
from router.precise.feeds import KVEventFeeds
from router.precise.tokenize import PromptTokenizer
from router.protocol.block_hash import block_hashes
from router.routing.keys import InvalidPrompt, RoutingKey, anchor

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PreciseKey:
    key: RoutingKey  # chain = 8-byte big-endian block keys, as vLLM's int hashes
    num_tokens: int
    block_size: int


@dataclass(frozen=True, slots=True)
class HashExtras:
    """What besides the token ids enters vLLM's block hashes (router/protocol/block_hash)."""

    cache_salt: str | None
    lora: tuple[str, str] | None  # (adapter name, path)


def _lora(model: str | None, candidates: Sequence[Worker]) -> tuple[str, str] | None:
    """(name, path) of the adapter ``model`` names, as the candidates loaded it."""
    for worker in candidates:
        adapter = worker.adapters.get(model or "")
        if adapter is not None:
            return adapter.name, adapter.path
    return None


def lora_parent(model: str | None, candidates: Sequence[Worker]) -> str | None:
    for worker in candidates:
        adapter = worker.adapters.get(model or "")
        if adapter is not None:
            return adapter.parent
    return model


class PreciseMatcher:
    def __init__(self, tokenizers: Mapping[str, PromptTokenizer], feeds: KVEventFeeds,
                 max_blocks: int, key_blocks: int) -> None:
        self.tokenizers = dict(tokenizers)
        self.feeds = feeds
        self.residency: ExactResidency = feeds.residency
        self.max_blocks = max_blocks
        self.key_blocks = key_blocks

    def _hash_params(self, candidates: Sequence[Worker]) -> tuple[int, str] | None:
        seen = set()
        for worker in candidates:
            params = self.feeds.params(worker.id)
            if params is None:
                return None
            seen.add((params.block_size, params.hash_seed))
        return seen.pop() if len(seen) == 1 else None

    async def key(self, body: Mapping[str, Any], model: str | None, chat: bool,
                  candidates: Sequence[Worker]) -> PreciseKey | None:
        """None when the request can't be hashed as the engines hash it. A LoRA adapter
        is tokenized by its parent's tokenizer and hashed with its (name, path), as vLLM
        keys an adapter's blocks apart from the base model's."""
        lora = _lora(model, candidates)
        base = lora_parent(model, candidates) if lora is not None else model
        tokenizer = self.tokenizers.get(base or "")
        params = self._hash_params(candidates) if tokenizer is not None else None
        if tokenizer is None or params is None:
            return None
        block_size, seed = params
        extra = HashExtras(body.get("cache_salt"), lora)
        try:
            ids, chain = await asyncio.to_thread(self._ids_and_chain, tokenizer, body, chat,
                                                 block_size, seed, extra)
        except InvalidPrompt:
            raise
        except Exception as exc:  # noqa: BLE001 - a template error: route approximately
            log.warning("precise tokenization failed, routing on text: %r", exc)
            return None
        key = anchor(chain, self.key_blocks, lambda: repr(ids).encode())
        return PreciseKey(RoutingKey(key=key, chain=chain), len(ids), block_size)

    def _ids_and_chain(self, tokenizer: PromptTokenizer, body: Mapping[str, Any], chat: bool,
                       block_size: int, seed: str, extra: HashExtras
                       ) -> tuple[list[int], tuple[bytes, ...]]:
        """Tokenize and hash in a worker thread: both are CPU work (~30 ms and ~6 ms for
        12 k tokens here) that would otherwise stall every other request on the loop."""
        ids = tokenizer.token_ids(body, chat)
        usable = ids[: self.max_blocks * block_size]
        return ids, tuple(block_key(h).to_bytes(8, "big")
                          for h in block_hashes(usable, block_size, seed=seed,
                                                cache_salt=extra.cache_salt, lora=extra.lora))

    def match(self, chain: Sequence[bytes], worker_ids: Collection[str]) -> dict[str, int]:
        """Leading blocks of the chain each worker holds now (its exact cache hit), asked
        only of the workers holding the chain's head."""
        out = {}
        if not chain:
            return out
        for worker_id in _among(self.residency.holders(chain[0]), worker_ids):
            hit = self.residency.match(worker_id, chain)
            if hit:
                out[worker_id] = hit
        return out

    def offloaded(self, chain: Sequence[bytes], gpu: Mapping[str, int],
                  worker_ids: Sequence[str]) -> dict[str, int]:
        """Blocks after each worker's GPU hit that it holds in an offload tier: asked of the
        workers with a GPU hit and those holding the head offloaded (a hit of 0)."""
        out = {}
        if not chain:
            return out
        asked = set(_among(self.residency.holders(chain[0], gpu=False), worker_ids))
        asked.update(w for w in gpu if gpu[w])
        for worker_id in asked:
            extra = self.residency.match_offloaded(worker_id, chain, gpu.get(worker_id, 0))
            if extra:
                out[worker_id] = extra
        return out


def _among(holders: set[str], worker_ids: Collection[str]) -> list[str]:
    """``holders`` that are candidates, walking the smaller side."""
    if len(holders) < len(worker_ids):
        wanted = worker_ids if isinstance(worker_ids, (set, frozenset)) else set(worker_ids)
        return [w for w in holders if w in wanted]
    return [w for w in worker_ids if w in holders]
