"""vLLM-compatible chained block hashes, so our KV events are interchangeable with vLLM's.

vLLM v1 hashes a full block as ``H((parent_hash, tuple(token_ids), extra_keys))`` where the
first block's parent is ``NONE_HASH``: ``H(PYTHONHASHSEED)`` when that variable is set, else
32 random bytes. ``H`` is ``sha256`` (pickle, highest protocol) or ``sha256_cbor`` (canonical
CBOR). We implement the same definitions independently (see vllm/v1/core/kv_cache_utils.py
and vllm/utils/hashing.py for the reference).
"""

from __future__ import annotations

import hashlib
import os
import pickle
from collections.abc import Callable, Sequence
from typing import Any

import cbor2

from router.protocol.block_hash import block_extra_keys

HashFn = Callable[[Any], bytes]


def sha256_pickle(obj: Any) -> bytes:
    """vLLM's ``sha256``: pickle is Python-only but is vLLM's historical default."""
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def sha256_cbor(obj: Any) -> bytes:
    """vLLM's ``sha256_cbor``: language-neutral, so other processes can recompute it."""
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


HASH_FUNCTIONS: dict[str, HashFn] = {"sha256": sha256_pickle, "sha256_cbor": sha256_cbor}


def none_hash(hash_fn: HashFn, seed: str | None = None) -> bytes:
    """Root of every chain; reproducible only when PYTHONHASHSEED (or ``seed``) is given."""
    value = seed if seed is not None else os.environ.get("PYTHONHASHSEED")
    if value is None:
        return os.urandom(32)
    return hash_fn(value)


class BlockHasher:
    """Computes chained hashes of full blocks for one engine (one NONE_HASH per engine)."""

    def __init__(self, block_size: int = 16, algo: str = "sha256_cbor",
                 seed: str | None = None) -> None:
        if algo not in HASH_FUNCTIONS:
            raise ValueError(f"unknown hash algorithm {algo!r}; use one of {list(HASH_FUNCTIONS)}")
        self.block_size = block_size
        self.algo = algo
        self.fn = HASH_FUNCTIONS[algo]
        self.root = none_hash(self.fn, seed)

    def hash_block(self, parent: bytes | None, tokens: Sequence[int],
                   extra_keys: tuple[Any, ...] | None = None) -> bytes:
        return self.fn((self.root if parent is None else parent, tuple(tokens), extra_keys))

    def chain(self, tokens: Sequence[int], parent: bytes | None = None,
              cache_salt: str | None = None, lora: tuple[str, str] | None = None
              ) -> list[bytes]:
        """Hashes of every full block of ``tokens`` (the trailing partial block is not
        hashed), with vLLM's extra keys for a cache_salt and a LoRA adapter (name, path)."""
        out: list[bytes] = []
        bs = self.block_size
        for start in range(0, len(tokens) - bs + 1, bs):
            parent = self.hash_block(parent, tokens[start:start + bs],
                                     block_extra_keys(start, cache_salt, lora))
            out.append(parent)
        return out


def to_external(block_hash: bytes, as_int: bool = False) -> bytes | int:
    """The form a KV event carries: raw bytes (vLLM default) or the low 64 bits as an int
    (vLLM with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1)."""
    if not as_int:
        return block_hash
    return int.from_bytes(block_hash, "big") & ((1 << 64) - 1)
