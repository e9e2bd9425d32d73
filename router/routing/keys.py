"""Routing keys: the block-hash chain of a prompt and the key that places it on the ring.

The chain approximates vLLM's prefix cache in the text domain: fixed blocks of the
canonical prompt, each hash chained to its parent, only full blocks hashed. Two prompts
that share their leading text share the leading links of their chains, so residency can
be matched without a tokenizer.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from hashlib import blake2b, sha256
from typing import Any

import orjson

from router.client.contract import is_valid_context_hash

HASH_BYTES = 8


class InvalidPrompt(ValueError):
    """The body does not hold a prompt this router can read (becomes a 400)."""


@dataclass(frozen=True, slots=True)
class RoutingKey:
    """``key`` places the request on the ring; ``chain`` matches residency."""

    key: str
    chain: tuple[bytes, ...]


TAIL_FACTOR = 16  # a tail block is this many head blocks long


def block_ends(length: int, block_size: int, max_blocks: int) -> list[int]:
    """Where the chain's full blocks end in a prompt of ``length`` bytes: ``max_blocks``
    head blocks of ``block_size`` bytes, then up to as many tail blocks ``TAIL_FACTOR``
    times as long. Fixed offsets, whatever the prompt's length, so two prompts sharing
    their leading bytes share their leading blocks. Why a tail: a long conversation's
    history (the Mooncake trace reaches 120 k tokens) matched only over its first 64 KB
    looked no warmer on the worker holding all of it than on one holding 15 k tokens, and
    its turns left their warm worker; a cap that far in 256-byte blocks would cost 2,000
    residency entries per request."""
    head = min(length // block_size, max_blocks)
    ends = list(range(block_size, head * block_size + 1, block_size))
    if head == max_blocks:
        tail = block_size * TAIL_FACTOR
        start = head * block_size
        count = min((length - start) // tail, max_blocks)
        ends += range(start + tail, start + count * tail + 1, tail)
    return ends


def block_chain(data: bytes, block_size: int, max_blocks: int, seed: bytes) -> tuple[bytes, ...]:
    """The first 8 bytes of sha256(seed + each full-block prefix of data), blocks as
    ``block_ends`` lays them: link i names the whole prefix up to block i, as a chained
    hash would. One running hash, read at each block's end. The per-block Python calls
    cost as much as the hashing (~0.4 µs a block each, 72 blocks in an 18 KB prompt), so
    the loop holds nothing but the calls; sha256 because CPUs hash it in hardware
    (SHA-NI, ARMv8's SHA2): 0.6 µs a KB here against blake2b's 1.3."""
    running = sha256(seed)
    update, digest = running.update, running.digest
    chain: list[bytes] = []
    link = chain.append
    view = memoryview(data)
    start = 0
    for end in block_ends(len(data), block_size, max_blocks):
        update(view[start:end])
        link(digest()[:HASH_BYTES])
        start = end
    return tuple(chain)


def shared_links(chain: Sequence[bytes], other: Sequence[bytes], upto: int | None = None) -> int:
    """How many leading links two chains share, at most ``upto``: link i names the whole
    prefix up to block i, so they share k links exactly when their k-th links are equal,
    and the shared length is found by bisection."""
    lo, hi = 0, min(len(chain), len(other))
    if upto is not None:
        hi = min(hi, upto)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if chain[mid - 1] == other[mid - 1]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def head_blocks_covered(blocks: int, max_blocks: int) -> int:
    """How many head-sized blocks the first ``blocks`` links of a chain cover."""
    if blocks <= max_blocks:
        return blocks
    return max_blocks + (blocks - max_blocks) * TAIL_FACTOR


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                text = part.get("text")
                parts.append(text if isinstance(text, str) else orjson.dumps(part).decode())
            else:
                parts.append(str(part))
        return "".join(parts)
    return orjson.dumps(content).decode()


def chat_prompt_bytes(body: dict[str, Any]) -> bytes:
    """Canonical text of a chat request in the order the engine sees it: tools, then messages."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidPrompt("'messages' must be a non-empty array")
    pieces: list[str] = []
    tools = body.get("tools")
    if tools:
        pieces.append("<|tools|>" + orjson.dumps(tools, option=orjson.OPT_SORT_KEYS).decode())
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise InvalidPrompt("each message must be an object with a string 'role'")
        pieces.append(f"<|{message['role']}|>{_content_text(message.get('content'))}")
        if message.get("tool_calls"):
            pieces.append(orjson.dumps(message["tool_calls"], option=orjson.OPT_SORT_KEYS).decode())
    return "".join(pieces).encode()


def completion_prompt_bytes(body: dict[str, Any]) -> bytes:
    """Canonical bytes of a completions prompt: UTF-8 text, or packed int32 token ids."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt.encode()
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if isinstance(first, int):
            return _token_bytes(prompt)
        if isinstance(first, str):  # a batch: route on its first prompt
            return first.encode()
        if isinstance(first, list):
            return _token_bytes(first)
    raise InvalidPrompt("'prompt' must be a string, an array of strings or of token ids")


def _token_bytes(tokens: Sequence[Any]) -> bytes:
    try:
        return array("i", tokens).tobytes()
    except (TypeError, OverflowError) as exc:
        raise InvalidPrompt("token ids must be integers") from exc


def check_context_hash(value: str) -> None:
    """The format is the SDK's contract (router/client/contract.py), checked in one place."""
    if not is_valid_context_hash(value):
        raise InvalidPrompt("X-Context-Hash must be 8-64 hexadecimal characters")


def anchor(chain: Sequence[bytes], key_blocks: int, whole: Callable[[], bytes],
           seed: bytes = b"") -> str:
    """The ring key of a chain (text or precise): its link at block min(n, key_blocks), so
    prompts sharing their first ``key_blocks`` blocks share a home. A prompt shorter than
    one block has nothing to share and is spread by a hash of all of it: ``whole()``, only
    called then (turning a long token list into bytes is not free)."""
    if chain:
        return chain[min(len(chain), key_blocks) - 1].hex()
    return blake2b(whole(), digest_size=HASH_BYTES, key=seed).hexdigest()


def cache_salt(body: dict[str, Any]) -> str | None:
    """vLLM's ``cache_salt``: a tenant's prefix-cache namespace (a non-empty string)."""
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise InvalidPrompt("'cache_salt' must be a non-empty string")
    return salt


@lru_cache(maxsize=256)
def chain_seed(model: str, salt: str | None = None) -> bytes:
    """The chain's root: the model, and the salt when sent. vLLM folds the salt into the
    first block's hash only, which changes every later link too; seeding the text chain
    with it does the same, so prompts of different tenants share no link (and no key)."""
    data = model.encode() if salt is None else model.encode() + b"\x00salt\x00" + salt.encode()
    return blake2b(data, digest_size=HASH_BYTES).digest()


def prompt_key(prompt: bytes, model: str, block_size: int, max_blocks: int,
               key_blocks: int, salt: str | None = None) -> RoutingKey:
    """Key from the prompt itself: the chain link at block min(n, key_blocks)."""
    seed = chain_seed(model, salt)
    chain = block_chain(prompt, block_size, max_blocks, seed)
    return RoutingKey(key=anchor(chain, key_blocks, lambda: prompt, seed), chain=chain)
