"""Key canonicalisation and the block-hash chain (router/routing/keys.py)."""

from __future__ import annotations

import sys
from hashlib import blake2b, sha256

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.routing.keys import (
    HASH_BYTES,
    TAIL_FACTOR,
    InvalidPrompt,
    RoutingKey,
    block_chain,
    chat_prompt_bytes,
    check_context_hash,
    completion_prompt_bytes,
    head_blocks_covered,
    prompt_key,
)
from router.routing.request import RoutingRequest

RELAXED = settings(deadline=None)  # a busy machine must not fail an example on time
INT32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
SEED_A = blake2b(b"model-a", digest_size=HASH_BYTES).digest()
SEED_B = blake2b(b"model-b", digest_size=HASH_BYTES).digest()


def packed(tokens: list[int]) -> bytes:
    return b"".join(t.to_bytes(4, sys.byteorder, signed=True) for t in tokens)


# -- chat ----------------------------------------------------------------------------------
def test_chat_bytes_are_tools_then_messages_with_role_tags() -> None:
    tools = [{"type": "function", "function": {"name": "search", "parameters": {}}}]
    calls = [{"id": "c1", "type": "function", "function": {"name": "search",
                                                          "arguments": "{}"}}]
    body = {"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Look "},
                                     {"type": "image_url", "image_url": {"url": "x"}},
                                     "up"]},
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "content": "found it"},
    ], "tools": tools}
    sorted_json = orjson.OPT_SORT_KEYS
    expected = ("<|tools|>" + orjson.dumps(tools, option=sorted_json).decode()
                + "<|system|>Be brief."
                + '<|user|>Look {"type":"image_url","image_url":{"url":"x"}}up'
                + "<|assistant|>" + orjson.dumps(calls, option=sorted_json).decode()
                + "<|tool|>found it").encode()
    assert chat_prompt_bytes(body) == expected


def test_chat_bytes_do_not_depend_on_key_order_in_tools_or_calls() -> None:
    a = {"messages": [{"role": "assistant", "content": "", "tool_calls": [{"a": 1, "b": 2}]}],
         "tools": [{"name": "t", "params": {"x": 1, "y": 2}}]}
    b = {"tools": [{"params": {"y": 2, "x": 1}, "name": "t"}],
         "messages": [{"tool_calls": [{"b": 2, "a": 1}], "content": "", "role": "assistant"}]}
    assert chat_prompt_bytes(a) == chat_prompt_bytes(b)


def test_chat_roles_and_order_matter() -> None:
    one = {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}
    swapped = {"messages": one["messages"][::-1]}
    other_role = {"messages": [{"role": "system", "content": "a"},
                               {"role": "user", "content": "b"}]}
    assert len({chat_prompt_bytes(one), chat_prompt_bytes(swapped),
                chat_prompt_bytes(other_role)}) == 3


@RELAXED
@given(st.lists(st.text(max_size=20), min_size=1, max_size=5))
def test_content_parts_read_as_their_joined_text(parts: list[str]) -> None:
    as_parts = {"messages": [{"role": "user",
                              "content": [{"type": "text", "text": p} for p in parts]}]}
    as_string = {"messages": [{"role": "user", "content": "".join(parts)}]}
    assert chat_prompt_bytes(as_parts) == chat_prompt_bytes(as_string)


@pytest.mark.parametrize("body", [
    {}, {"messages": []}, {"messages": "hi"}, {"messages": ["hi"]},
    {"messages": [{"content": "no role"}]}, {"messages": [{"role": 3, "content": "x"}]},
])
def test_invalid_chat_bodies_raise(body: dict) -> None:
    with pytest.raises(InvalidPrompt):
        chat_prompt_bytes(body)


# -- completions ------------------------------------------------------------------------------
@pytest.mark.parametrize("prompt, expected", [
    ("héllo", "héllo".encode()),
    ("", b""),
    (["first", "second"], b"first"),
    ([1, 2, -3], packed([1, 2, -3])),
    ([[7, 8], [9]], packed([7, 8])),
])
def test_completion_prompt_forms(prompt: object, expected: bytes) -> None:
    assert completion_prompt_bytes({"prompt": prompt}) == expected


@RELAXED
@given(st.lists(INT32, min_size=1, max_size=64))
def test_token_ids_pack_as_int32(tokens: list[int]) -> None:
    assert completion_prompt_bytes({"prompt": tokens}) == packed(tokens)
    assert completion_prompt_bytes({"prompt": [tokens, [1]]}) == packed(tokens)


@pytest.mark.parametrize("prompt", [
    None, 12, [], [None], [1.5], [1, "a"], [2**31], [[1, "x"]], [["a"]], {"text": "x"},
])
def test_invalid_prompts_raise(prompt: object) -> None:
    with pytest.raises(InvalidPrompt):
        completion_prompt_bytes({"prompt": prompt} if prompt is not None else {})


# -- block chain ------------------------------------------------------------------------------
@RELAXED
@given(st.binary(max_size=3000), st.integers(1, 64), st.integers(1, 20))
def test_chain_hashes_only_full_blocks_up_to_the_cap(data: bytes, size: int, cap: int) -> None:
    chain = block_chain(data, size, cap, SEED_A)
    head = min(len(data) // size, cap)
    tail = min((len(data) - cap * size) // (size * TAIL_FACTOR), cap) if head == cap else 0
    assert len(chain) == head + tail
    assert all(len(link) == HASH_BYTES for link in chain)
    # the trailing partial block changes nothing
    covered = head_blocks_covered(len(chain), cap) * size
    assert block_chain(data[:covered], size, cap, SEED_A) == chain


def test_a_long_shared_history_is_matched_past_the_head_blocks() -> None:
    """Two turns of one conversation share their history's links after the first 64 KB
    too, and the links they share say how many prompt tokens that is."""
    history = bytes(range(256)) * 1200  # 300 KB
    turn_a, turn_b = history + b"first question", history + b"another question"
    a, b = block_chain(turn_a, 256, 256, SEED_A), block_chain(turn_b, 256, 256, SEED_A)
    assert a == b and len(a) == 256 + (300 * 1024 - 64 * 1024) // 4096  # every full block
    # is history (the questions are in the last, partial one)
    assert block_chain(b"x" + turn_a, 256, 256, SEED_A)[-1] != a[-1]
    request = RoutingRequest(RoutingKey("k", b), len(turn_b) / 4, 256 / 4, head_blocks=256)
    assert request.cached_tokens(len(a)) == len(history) / 4  # the whole history


def test_each_link_is_sha256_of_the_seed_and_the_whole_prefix() -> None:
    data = bytes(range(256)) * 2
    chain = block_chain(data, 128, 10, SEED_A)
    expected = [sha256(SEED_A + data[: (i + 1) * 128]).digest()[:HASH_BYTES]
                for i in range(4)]
    assert chain == tuple(expected)


@RELAXED
@given(st.binary(min_size=0, max_size=300), st.binary(min_size=1, max_size=300),
       st.binary(min_size=1, max_size=300), st.integers(1, 32))
def test_a_shared_leading_text_shares_leading_links(shared: bytes, tail_a: bytes,
                                                   tail_b: bytes, size: int) -> None:
    da, db = shared + tail_a, shared + tail_b
    a, b = block_chain(da, size, 1000, SEED_A), block_chain(db, size, 1000, SEED_A)
    common = len(shared) // size
    assert a[:common] == b[:common]
    # link i agrees exactly when the texts agree up to the end of block i
    for i in range(min(len(a), len(b))):
        end = (i + 1) * size
        assert (a[i] == b[i]) == (da[:end] == db[:end])


@RELAXED
@given(st.binary(min_size=64, max_size=400))
def test_model_seeds_give_different_chains(data: bytes) -> None:
    a, b = block_chain(data, 32, 100, SEED_A), block_chain(data, 32, 100, SEED_B)
    assert a and all(x != y for x, y in zip(a, b, strict=True))


# -- prompt key ---------------------------------------------------------------------------------
@RELAXED
@given(st.integers(0, 12), st.integers(1, 8))
def test_prompt_key_anchors_at_min_n_key_blocks(n_blocks: int, key_blocks: int) -> None:
    prompt = bytes(i % 251 for i in range(n_blocks * 16)) + b"tail"
    key = prompt_key(prompt, "m", 16, 100, key_blocks)
    seed = blake2b(b"m", digest_size=HASH_BYTES).digest()
    assert key.chain == block_chain(prompt, 16, 100, seed)
    if n_blocks:
        assert key.key == key.chain[min(n_blocks, key_blocks) - 1].hex()
    else:
        assert key.key == blake2b(prompt, digest_size=HASH_BYTES, key=seed).hexdigest()


def test_prompts_sharing_the_key_blocks_share_the_ring_key() -> None:
    doc = b"".join(b"block %03d " % i + b"." * 6 for i in range(8))  # 8 blocks of 16
    a = prompt_key(doc + b"question one, long enough", "m", 16, 100, 4)
    b = prompt_key(doc + b"question two, long enough", "m", 16, 100, 4)
    assert a.key == b.key and a.chain != b.chain
    assert prompt_key(doc, "other", 16, 100, 4).key != a.key
    short_a, short_b = prompt_key(b"hi", "m", 16, 100, 4), prompt_key(b"ho", "m", 16, 100, 4)
    assert short_a.chain == () and short_a.key != short_b.key


# -- X-Context-Hash --------------------------------------------------------------------------------
@RELAXED
@given(st.text(alphabet="0123456789abcdefABCDEF", min_size=8, max_size=64))
def test_context_hash_accepts_8_to_64_hex(value: str) -> None:
    check_context_hash(value)


@RELAXED
@given(st.text(alphabet="0123456789abcdef", max_size=7)
       | st.text(alphabet="0123456789abcdef", min_size=65, max_size=80)
       | st.text(min_size=8, max_size=64).filter(
           lambda s: any(c not in "0123456789abcdefABCDEF" for c in s)))
def test_context_hash_rejects_anything_else(value: str) -> None:
    with pytest.raises(InvalidPrompt):
        check_context_hash(value)


@pytest.mark.parametrize("value", ["deadbeef\n", " deadbeef", "0xdeadbeef", "dead-beef",
                                   "deadbee", "０１２３４５６７"])
def test_context_hash_edge_cases(value: str) -> None:
    with pytest.raises(InvalidPrompt):
        check_context_hash(value)
