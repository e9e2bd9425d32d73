"""Request bodies for the fuzzer: valid ones for each API the router serves, and the ways a
client gets them wrong (wrong types, odd numbers, junk JSON, bytes that are not JSON).

Why hand-written valid bodies: /openapi.json names only the fields the router itself reads
(the rest are the engine's and pass through), so a body built from it alone would almost
never be a request a worker accepts; these strategies fill those fields the way the APIs
expect, and the document decides which routes are driven (cases.py). Valid bodies ask
for a few tokens, so 5,000 cases stay cheap on a small machine.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson
from hypothesis import strategies as st

Body = dict[str, Any]
MAX_TOKENS = st.integers(1, 4)

# shared leading context, so routing meets prefixes it has seen (residency, replicas)
DOCUMENTS = tuple(f"Document {i}: " + " ".join(f"fact{i}-{j}" for j in range(60))
                  for i in range(3))

short_text = st.text(st.characters(codec="utf-8"), max_size=16)
odd_text = st.sampled_from(["", " ", "\x00", "\u202e", "\ufeff", "🦜" * 3, "\\u0000",
                            "a\r\nb", "null", "<|user|>", "\u0000\u0001\u001f", "%s%n"])
big_text = st.integers(2_000, 60_000).map(lambda n: "é" * n)
text = st.one_of(short_text, odd_text, st.sampled_from(DOCUMENTS))


def rarely(odd: st.SearchStrategy[Any], usual: st.SearchStrategy[Any],
           one_in: int = 40) -> st.SearchStrategy[Any]:
    """``odd`` about once in ``one_in`` draws, else ``usual``."""
    return st.integers(1, one_in).flatmap(lambda i: odd if i == one_in else usual)


prompt = rarely(big_text, st.one_of(
    short_text.filter(bool),
    st.builds(lambda doc, q: doc + " " + q, st.sampled_from(DOCUMENTS), short_text),
))

# any JSON value, small: what a confused client puts where a field belongs
scalars = st.one_of(st.none(), st.booleans(),
                    st.integers(-(2**70), 2**70), st.sampled_from([0, -1, 2**31, 2**63, -2**63]),
                    st.floats(allow_nan=False, allow_infinity=False), short_text, odd_text)
junk = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(short_text, inner, max_size=3)),
    max_leaves=5)


def _with(required: dict[str, st.SearchStrategy[Any]],
          optional: dict[str, st.SearchStrategy[Any]] | None = None) -> st.SearchStrategy[Body]:
    return st.fixed_dictionaries(required, optional=optional or {})


def _content() -> st.SearchStrategy[Any]:
    part = st.fixed_dictionaries({"type": st.just("text"), "text": text})
    return st.one_of(text, st.lists(part, min_size=1, max_size=2))


def _chat_messages() -> st.SearchStrategy[list[Body]]:
    first = st.fixed_dictionaries({"role": st.just("user"),
                                   "content": st.one_of(prompt, _content())})
    other = st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]),
                                   "content": _content()})
    return st.builds(lambda head, rest: [*rest, head], first, st.lists(other, max_size=2))


TOOL = {"type": "function", "function": {"name": "lookup", "description": "find a fact",
                                         "parameters": {"type": "object", "properties": {
                                             "q": {"type": "string"}}}}}
STREAMING = {"stream": st.booleans()}  # required: half the generations stream
GENERATION = {"temperature": st.floats(0, 2), "top_p": st.floats(0.01, 1),
              "seed": st.integers(0, 2**31), "user": short_text,
              "cache_salt": short_text.filter(bool)}


def chat(model: str) -> st.SearchStrategy[Body]:
    return _with({"model": st.just(model), "messages": _chat_messages(),
                  "max_tokens": MAX_TOKENS, **STREAMING},
                 {**GENERATION, "n": st.integers(1, 2),
                  "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
                  "tools": st.just([TOOL])})


def completions(model: str) -> st.SearchStrategy[Body]:
    prompts = st.one_of(prompt, st.lists(st.integers(0, 30_000), min_size=1, max_size=24),
                        prompt.map(lambda p: [p]))
    return _with({"model": st.just(model), "prompt": prompts, "max_tokens": MAX_TOKENS,
                  **STREAMING},
                 {**GENERATION, "n": st.integers(1, 2), "echo": st.booleans(),
                  "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()})})


def responses(model: str) -> st.SearchStrategy[Body]:
    item = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system"]),
                                  "content": prompt})
    return _with({"model": st.just(model),
                  "input": st.one_of(prompt, st.lists(item, min_size=1, max_size=2)),
                  "max_output_tokens": MAX_TOKENS, **STREAMING},
                 {"instructions": text, "store": st.booleans(),
                  "cache_salt": short_text.filter(bool)})


def messages(model: str) -> st.SearchStrategy[Body]:
    history = st.lists(st.fixed_dictionaries({"role": st.just("user"),
                                              "content": st.one_of(prompt, _content())}),
                       min_size=1, max_size=2)
    system = st.one_of(text, st.lists(st.fixed_dictionaries({"type": st.just("text"),
                                                             "text": text}), max_size=2))
    return _with({"model": st.just(model), "messages": history, "max_tokens": MAX_TOKENS,
                  **STREAMING},
                 {"system": system})


def count_tokens(model: str) -> st.SearchStrategy[Body]:
    return _with({"model": st.just(model),
                  "messages": st.lists(st.fixed_dictionaries({"role": st.just("user"),
                                                              "content": prompt}),
                                       min_size=1, max_size=2)})


def inputs(model: str) -> st.SearchStrategy[Body]:
    """Embeddings, pooling, classify."""
    return _with({"model": st.just(model),
                  "input": st.one_of(prompt, st.lists(prompt, min_size=1, max_size=3))})


def rerank(model: str) -> st.SearchStrategy[Body]:
    return _with({"model": st.just(model), "query": prompt,
                  "documents": st.lists(prompt, min_size=1, max_size=3)},
                 {"top_n": st.integers(1, 3)})


def score(model: str) -> st.SearchStrategy[Body]:
    return _with({"model": st.just(model), "text_1": prompt,
                  "text_2": st.one_of(prompt, st.lists(prompt, min_size=1, max_size=3))})


def tokenize(model: str) -> st.SearchStrategy[Body]:
    return st.one_of(_with({"model": st.just(model), "prompt": prompt}),
                     _with({"model": st.just(model), "messages": _chat_messages()}))


def detokenize(model: str) -> st.SearchStrategy[Body]:
    return _with({"model": st.just(model),
                  "tokens": st.lists(st.integers(0, 30_000), min_size=1, max_size=16)})


VALID: dict[str, Callable[[str], st.SearchStrategy[Body]]] = {
    "/v1/chat/completions": chat, "/v1/completions": completions,
    "/v1/responses": responses, "/v1/messages": messages,
    "/v1/messages/count_tokens": count_tokens,
    "/v1/embeddings": inputs, "/pooling": inputs, "/classify": inputs,
    "/v1/rerank": rerank, "/rerank": rerank, "/v2/rerank": rerank,
    "/score": score, "/v1/score": score,
    "/tokenize": tokenize, "/detokenize": detokenize,
}


def documented(fields: list[str], model: str) -> st.SearchStrategy[Body]:
    """A route without a valid-body strategy here: its documented fields, junk-valued."""
    return _with({"model": st.just(model)}, {name: junk for name in fields if name != "model"})


# -- the ways a body goes wrong ---------------------------------------------------------
ODD_NUMBERS = st.sampled_from([0, -1, -(2**63), 2**63, 2**64 + 1, 10**30, 1.5, -0.0, 1e308,
                               "4", True, False, None, [], {}])
NUMERIC_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens", "n", "top_n",
                  "temperature", "top_p", "seed", "logprobs", "best_of", "truncate_prompt_tokens")


_HOW = st.sampled_from(["drop", "retype", "number", "extra", "model", "deep"])
_NUMERIC = st.sampled_from(NUMERIC_FIELDS)
_EXTRA = st.dictionaries(short_text, junk, min_size=1, max_size=3)
_ODD_MODEL = st.one_of(short_text, junk)


def _pick(draw: st.DrawFn, options: list[str]) -> str:
    return options[draw(st.integers(0, len(options) - 1))]  # cheaper than a new sampled_from


@st.composite
def mutated(draw: st.DrawFn, valid: st.SearchStrategy[Body]) -> Body:
    """A valid body with one thing wrong: a field dropped, retyped, oddly numbered, or junk
    added; or a model no worker serves."""
    body = dict(draw(valid))
    how = draw(_HOW)
    keys = sorted(body)
    if how == "drop" and keys:
        body.pop(_pick(draw, keys))
    elif how == "retype" and keys:
        body[_pick(draw, keys)] = draw(junk)
    elif how == "number":
        body[draw(_NUMERIC)] = draw(ODD_NUMBERS)
    elif how == "extra":
        body.update(draw(_EXTRA))
    elif how == "model":
        body["model"] = draw(_ODD_MODEL)
    elif how == "deep":
        target = _pick(draw, keys) if keys else "messages"
        depth = draw(st.integers(50, 400))
        body[target] = orjson.loads("[" * depth + "]" * depth)
    return body


def encode(body: Any) -> bytes:
    """The stdlib's encoder: integers past 64 bits are JSON too (orjson refuses them)."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


NOT_JSON = st.one_of(
    st.sampled_from([b"", b" ", b"{", b"}", b"[", b"null", b"true", b"0", b'"x"', b"[]",
                     b"{'model': 'x'}", b'{"model":}', b'{"a":1,}', b"NaN",
                     b'{"stream": NaN}', b"\xef\xbb\xbf{}", b"\xff\xfe{\x00}\x00",
                     b'{"model": "\\ud800"}', b'{"model": "\xc3\x28"}', b"\x00" * 8,
                     b'{"a":' * 2000, b"[" * 5000 + b"]" * 5000,
                     b'{"messages": [' + b"{}," * 3000 + b"{}]}"]),
    st.binary(max_size=48),
)


@st.composite
def broken_json(draw: st.DrawFn, valid: st.SearchStrategy[Body]) -> bytes:
    """Bytes of a valid body, cut or with a byte changed (rarely still valid JSON)."""
    data = bytearray(encode(draw(valid)))
    if draw(st.booleans()):
        return bytes(data[:draw(st.integers(0, max(0, len(data) - 1)))])
    at = draw(st.integers(0, len(data) - 1))
    data[at] = draw(st.integers(0, 255))
    return bytes(data)
