"""The routing-key contract shared by the SDK, the official-openai helper and the router docs.

`X-Context-Hash` names the retrieved context of a request (the documents in retrieved
order, before the question). The router sends requests with equal hashes to the worker that
holds that context warm in its KV cache. The function lives here, dependency-free, so an
application can compute the same key without the rest of the SDK.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from router.client.contract import CONTEXT_HASH_HEADER, is_valid_context_hash

DOCUMENT_SEPARATOR = "\n\n"
"""Joins retrieved documents into one context and the context to the question."""


def context_hash(text: str) -> str:
    """SHA-256 of the UTF-8 text, hex, first 16 characters (64 bits: collisions among a
    knowledge base's contexts are negligible, and the header stays short)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def openai_headers(context: str) -> dict[str, str]:
    """Headers for the official `openai` package: pass as `extra_headers=` on a call or as
    `default_headers=` on a client dedicated to one context."""
    return {CONTEXT_HASH_HEADER: context_hash(context)}


def is_valid_key(key: str) -> bool:
    """Whether `key` is an acceptable `X-Context-Hash` value: 8 to 64 hex characters."""
    return is_valid_context_hash(key)


def join_documents(context: str | Sequence[str], separator: str = DOCUMENT_SEPARATOR) -> str:
    """One context string from a string or from retrieved documents in retrieved order.

    Order matters: the engine caches prefixes, so the same documents in another order are
    another prefix and, rightly, another key."""
    if isinstance(context, str):
        return context
    docs = list(context)
    if not all(isinstance(doc, str) for doc in docs):
        raise TypeError("context must be a str or a sequence of str")
    return separator.join(docs)
