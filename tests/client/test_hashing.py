"""The key contract: SHA-256 of the UTF-8 context, first 16 hex characters."""

from __future__ import annotations

import hashlib

from hypothesis import given
from hypothesis import strategies as st

from router.client import CONTEXT_HASH_HEADER, context_hash, join_documents, openai_headers
from router.client.hashing import is_valid_key


def test_known_value() -> None:
    assert context_hash("hello") == "2cf24dba5fb0a30e"
    assert context_hash("") == "e3b0c44298fc1c14"


@given(st.text())
def test_matches_sha256_prefix_and_is_a_valid_key(text: str) -> None:
    key = context_hash(text)
    assert key == hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
    assert is_valid_key(key)


def test_non_ascii_is_hashed_as_utf8() -> None:
    assert context_hash("Grüße 文書") == hashlib.sha256("Grüße 文書".encode()).hexdigest()[:16]


def test_openai_headers() -> None:
    assert CONTEXT_HASH_HEADER == "X-Context-Hash"
    assert openai_headers("doc") == {"X-Context-Hash": context_hash("doc")}


def test_key_validation() -> None:
    assert is_valid_key("deadbeef")
    assert is_valid_key("a" * 64)
    assert not is_valid_key("abc")  # too short
    assert not is_valid_key("a" * 65)
    assert not is_valid_key("not-hex!")


def test_documents_join_in_retrieved_order() -> None:
    assert join_documents(["a", "b"]) == "a\n\nb"
    assert join_documents("a\n\nb") == "a\n\nb"
    assert context_hash(join_documents(["a", "b"])) != context_hash(join_documents(["b", "a"]))
