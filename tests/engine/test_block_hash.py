"""router.protocol.block_hash: the chain properties precise routing relies on.

Equality with vLLM's own hashes is checked against a real worker in test_real_vllm.py.
"""

from __future__ import annotations

from router.precise.exact import block_key
from router.protocol.block_hash import block_hashes, none_hash


def test_only_full_blocks_are_hashed() -> None:
    assert len(block_hashes(list(range(95)), 32)) == 2
    assert len(block_hashes(list(range(96)), 32)) == 3
    assert block_hashes(list(range(31)), 32) == []


def test_chain_depends_on_prefix_and_seed() -> None:
    a = block_hashes([1] * 32 + [2] * 32, 32)
    b = block_hashes([1] * 32 + [3] * 32, 32)
    assert a[0] == b[0] and a[1] != b[1]
    assert block_hashes([1] * 32, 32, seed="1") != a[:1]
    assert none_hash("0") != none_hash("1")


def test_known_value_of_vllm_0_32() -> None:
    """vLLM 0.32: hash_block_tokens(sha256_cbor, None, range(32)) with PYTHONHASHSEED=0."""
    assert block_key(block_hashes(list(range(32)), 32)[0]) == 16788556735714370586


def test_cache_salt_and_lora_keys_match_vllm_0_32() -> None:
    """Values from vLLM 0.32's own get_request_block_hasher(32, sha256_cbor) on a Request of
    token ids range(64) with PYTHONHASHSEED=0, with cache_salt="tenant-a", with
    LoRARequest("ad", 1, "/tmp/ad"), and with both."""
    tokens = list(range(64))
    salted = [block_key(h) for h in block_hashes(tokens, 32, cache_salt="tenant-a")]
    adapter = [block_key(h) for h in block_hashes(tokens, 32, lora=("ad", "/tmp/ad"))]
    both = [block_key(h) for h in block_hashes(tokens, 32, cache_salt="tenant-a",
                                               lora=("ad", "/tmp/ad"))]
    assert salted == [13080109321100672061, 12776272267928612188]
    assert adapter == [6143437360846314322, 2727667701096981359]
    assert both == [14632950095330638323, 6810317850632159618]
