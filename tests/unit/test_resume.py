"""The resume module's pieces in process: what is resumable, the transcript, the splice."""

from __future__ import annotations

import orjson

from router.server import resume
from router.server.resume import Splice, Transcript, continuation, resumable


def chunk(text: str | None, *, role: bool = False, finish: str | None = None,
          rid: str = "chatcmpl-1", created: int = 100) -> bytes:
    delta: dict = {"role": "assistant"} if role else {}
    if text is not None:
        delta["content"] = text
    obj = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": "m",
           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def test_only_answers_a_continuation_can_reproduce_are_resumable() -> None:
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    assert resumable(chat, chat=True)
    assert not resumable({**chat, "n": 2}, chat=True)
    assert not resumable({**chat, "logprobs": True}, chat=True)
    assert resumable({"prompt": "x"}, chat=False) and resumable({"prompt": ["x"]}, chat=False)
    assert not resumable({"prompt": "x", "echo": True}, chat=False)
    assert not resumable({"prompt": [1, 2, 3]}, chat=False)
    assert not resumable({"prompt": "x", "logprobs": 2}, chat=False)


def test_transcript_relays_whole_events_only_and_adds_up_the_text() -> None:
    seen = Transcript(chat=True)
    whole = chunk("", role=True) + chunk("Hel")
    second = chunk("lo")
    assert seen.feed(whole + second[:10]) == whole  # half an event is held back
    assert seen.feed(second[10:]) == second
    seen.fold()
    assert (seen.text, seen.produced, seen.id, seen.created) == ("Hello", 2, "chatcmpl-1", 100)
    assert not seen.finished and not seen.done


def test_transcript_folds_a_long_stream_as_it_goes() -> None:
    seen = Transcript(chat=True)
    one = chunk("x")
    for _ in range(resume.FOLD_BYTES // len(one) + 1):
        seen.feed(one)
    assert seen.produced > 0  # folded without being asked: bounded memory
    seen.fold()
    assert seen.text == "x" * seen.produced


def test_continuation_of_a_chat_and_of_a_completion() -> None:
    seen = Transcript(chat=True)
    seen.feed(chunk("", role=True) + chunk("Once") + chunk(" upon"))
    seen.fold()
    body = continuation({"messages": [{"role": "user", "content": "tell"}], "max_tokens": 10,
                         "stream": True}, True, seen)
    assert body is not None
    assert body["messages"][-1] == {"role": "assistant", "content": "Once upon"}
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    assert body["max_tokens"] == 8
    assert continuation({"messages": [], "max_tokens": 2}, True, seen) is None  # all produced

    text = Transcript(chat=False)
    text.feed(b'data: {"id":"cmpl-1","created":5,"choices":[{"index":0,"text":" a"}]}\n\n')
    text.fold()
    assert continuation({"prompt": ["Say"], "max_tokens": 4}, False, text) == {
        "prompt": "Say a", "max_tokens": 3}


def test_splice_keeps_id_and_created_drops_the_role_chunk_and_counts_the_whole_answer() -> None:
    seen = Transcript(chat=True)
    seen.feed(chunk("", role=True) + chunk("Once") + chunk(" upon"))
    seen.fold()
    splice = Splice(seen)
    usage = {"id": "other", "created": 999, "choices": [],
             "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}}
    new = (chunk("", role=True, rid="other", created=999) + chunk(" a", rid="other", created=999)
           + b"data: " + orjson.dumps(usage) + b"\n\ndata: [DONE]\n\n")
    out = splice.rewrite(new[:7]) + splice.rewrite(new[7:])
    events = [e[6:] for e in out.split(b"\n\n") if e]
    assert events[-1] == b"[DONE]"
    objs = [orjson.loads(e) for e in events[:-1]]
    assert [o["choices"][0]["delta"] for o in objs[:-1]] == [{"content": " a"}]
    assert {(o["id"], o["created"]) for o in objs} == {("chatcmpl-1", 100)}
    assert objs[-1]["usage"]["completion_tokens"] == 5 and objs[-1]["usage"][
        "prompt_tokens"] == 10
