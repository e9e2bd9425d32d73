"""SSE decoding, byte by byte, independent of any server."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from router.client.sse import SSEDecoder, delta_text, response_text

STREAM = (
    b": keep-alive\n\n"
    b'data: {"a": 1}\n\n'
    b'data: {"b":\r\ndata: 2}\r\n\r\n'
    b"event: ignored\n"
    b'data: {"c": "\xc3\xa9"}\n\n'
    b"data: [DONE]\n\n"
)
EXPECTED = ['{"a": 1}', '{"b":\n2}', '{"c": "é"}', "[DONE]"]


def test_whole_stream() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(STREAM) == EXPECTED
    assert decoder.close() == []


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_any_split_gives_the_same_events(cuts: list[int]) -> None:
    decoder = SSEDecoder()
    out: list[str] = []
    bounds = [0, *sorted(cuts), len(STREAM)]
    for start, end in itertools.pairwise(bounds):
        out += decoder.feed(STREAM[start:end])
    out += decoder.close()
    assert out == EXPECTED


def test_unterminated_last_event_is_flushed_on_close() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b'data: {"x": 1}') == []
    assert decoder.close() == ['{"x": 1}']


def test_delta_text_for_both_chunk_formats() -> None:
    chat = {"choices": [{"index": 0, "delta": {"content": "hi"}}]}
    role_only = {"choices": [{"index": 0, "delta": {"role": "assistant"}}]}
    completion = {"choices": [{"index": 0, "text": "yo"}]}
    other_choice = {"choices": [{"index": 1, "delta": {"content": "no"}}]}
    assert delta_text(chat) == "hi"
    assert delta_text(role_only) == ""
    assert delta_text(completion) == "yo"
    assert delta_text(other_choice) == ""
    assert delta_text({"usage": {}}) == ""


def test_response_text_for_both_formats() -> None:
    assert response_text({"choices": [{"index": 0, "message": {"content": "a"}}]}) == "a"
    assert response_text({"choices": [{"index": 0, "text": "b"}]}) == "b"
    assert response_text({"choices": []}) == ""
