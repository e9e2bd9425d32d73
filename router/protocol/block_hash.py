"""vLLM's prefix-cache block hashes, recomputed outside vLLM (precise routing).

Why: with `--prefix-caching-hash-algo sha256_cbor` and a fixed PYTHONHASHSEED (what
prefix-worker sets), a block's hash depends only on the token ids before and in it, so a
router that tokenizes a prompt as vLLM does can compute the same hashes and look them up in
the exact residency built from KV events. Mirrors vllm/v1/core/kv_cache_utils.py
(hash_block_tokens, init_none_hash) and vllm/utils/hashing.py (sha256_cbor) of vLLM 0.32:

    NONE_HASH = sha256(cbor(PYTHONHASHSEED as a str))
    h_i       = sha256(cbor((h_{i-1} or NONE_HASH, tuple(block_i token ids), extra_keys)))

with canonical CBOR. Only full blocks are hashed. KV events carry `block_key(h)`, the low
64 bits, by default (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1). extra_keys is None for plain
text requests; ``block_extra_keys`` builds it for LoRA and cache_salt as
generate_block_hash_extra_keys does: tagged tuples, the adapter's ("lora", name, path) on
every block, then ("cache_salt", salt) on the first block only (its hash seeds the rest
of the chain, so one salted block isolates the whole prompt).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import cbor2


def sha256_cbor(value: Any) -> bytes:
    return hashlib.sha256(cbor2.dumps(value, canonical=True)).digest()


def none_hash(seed: str = "0") -> bytes:
    """The parent hash of a prompt's first block, from the workers' PYTHONHASHSEED."""
    return sha256_cbor(seed)


def block_extra_keys(start: int, cache_salt: str | None = None,
                     lora: tuple[str, str] | None = None) -> tuple[Any, ...] | None:
    """The extra keys of the block starting at token ``start``; lora is (name, path)."""
    keys: list[tuple[str, ...]] = []
    if lora is not None:
        keys.append(("lora", *lora))
    if start == 0 and cache_salt:
        keys.append(("cache_salt", cache_salt))
    return tuple(keys) or None


def block_hashes(token_ids: Sequence[int], block_size: int, seed: str = "0",
                 parent: bytes | None = None, cache_salt: str | None = None,
                 lora: tuple[str, str] | None = None) -> list[bytes]:
    """Chained sha256_cbor hashes of every full block of token_ids."""
    parent = parent or none_hash(seed)
    out: list[bytes] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        extra = block_extra_keys(start, cache_salt, lora)
        parent = sha256_cbor((parent, tuple(token_ids[start:start + block_size]), extra))
        out.append(parent)
    return out
