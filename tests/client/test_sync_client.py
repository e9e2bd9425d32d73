"""The blocking SDK: same behaviour as the async one, driven from plain threads."""

from __future__ import annotations

import threading

import pytest

from router.client import (
    APIConnectionError,
    Backoff,
    BadRequestError,
    ContextClient,
    StreamError,
    context_hash,
)
from tests.client.fakes import (
    ScriptedServer,
    chat_chunk,
    chat_ok,
    completion_chunk,
    completion_ok,
    error,
    sse,
)
from tests.support import free_port

FAST = Backoff(initial=0.01, maximum=0.05)
CONTEXT = "Doc A: the reactor runs at 300 K.\n\nDoc B: the pump is rated 5 bar."


def test_chat_with_retries_and_header() -> None:
    script = [error(503, retry_after="0"), error(503, retry_after="0"), chat_ok("fine")]
    with ScriptedServer(script) as server, ContextClient(server.url, backoff=FAST) as sdk:
        result = sdk.chat(CONTEXT, "q", model="m")
    assert server.attempts == 3
    assert result.text == "fine" and result.worker == "w1"
    assert all(s.headers["X-Context-Hash"] == context_hash(CONTEXT) for s in server.seen)


def test_complete_and_400() -> None:
    with ScriptedServer([completion_ok("t"), error(400, "bad")]) as server, \
            ContextClient(server.url, backoff=FAST) as sdk:
        assert sdk.complete(CONTEXT, "p", model="m").text == "t"
        with pytest.raises(BadRequestError) as info:
            sdk.complete(CONTEXT, "p", model="m")
    assert server.attempts == 2
    assert info.value.error["message"] == "bad"


def test_streams() -> None:
    chat = sse([chat_chunk("", role="assistant"), chat_chunk("x"), chat_chunk("y")], split=3)
    comp = sse([completion_chunk("1"), completion_chunk("2")])
    with ScriptedServer([chat, comp]) as server, ContextClient(server.url) as sdk:
        with sdk.chat(CONTEXT, "q", model="m", stream=True) as stream:
            assert stream.worker == "w1"
            assert list(stream) == ["x", "y"]
            assert stream.text == "xy"
        assert list(sdk.complete(CONTEXT, "p", model="m", stream=True)) == ["1", "2"]


def test_stream_error_event() -> None:
    err = {"error": {"message": "gone", "type": "upstream_error", "code": 502}}
    with ScriptedServer([sse([chat_chunk("a"), err], done=False)]) as server, \
            ContextClient(server.url) as sdk:
        stream = sdk.chat(CONTEXT, "q", model="m", stream=True)
        assert next(stream) == "a"
        with pytest.raises(StreamError) as info:
            next(stream)
    assert info.value.body == err


def test_connect_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with ContextClient(url, max_retries=1, backoff=FAST) as sdk, \
            pytest.raises(APIConnectionError) as info:
        sdk.chat(CONTEXT, "q", model="m")
    assert info.value.attempts == 2


def test_shared_between_threads() -> None:
    with ScriptedServer([chat_ok("ok")]) as server, ContextClient(server.url) as sdk:
        results: list[str] = []
        threads = [threading.Thread(target=lambda: results.append(
            sdk.chat(CONTEXT, "q", model="m").text)) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert results == ["ok"] * 8


async def test_usable_inside_a_running_event_loop() -> None:
    """Where `asyncio.run` would refuse to start, the private loop thread still works."""
    with ScriptedServer([chat_ok("ok")]) as server, ContextClient(server.url) as sdk:
        assert sdk.chat(CONTEXT, "q", model="m").text == "ok"


def test_close_is_idempotent_and_stops_the_thread() -> None:
    sdk = ContextClient("http://127.0.0.1:1")
    loop_thread = next(t for t in threading.enumerate() if t is sdk._runner._thread)
    sdk.close()
    sdk.close()
    assert not loop_thread.is_alive()
