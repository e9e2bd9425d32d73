"""The async SDK against a scripted server over real HTTP on 127.0.0.1."""

from __future__ import annotations

import time
from typing import Any

import pytest

from router.client import (
    APIConnectionError,
    APITimeoutError,
    AsyncContextClient,
    Backoff,
    BadRequestError,
    InternalServerError,
    NotFoundError,
    RateLimitError,
    ServiceUnavailableError,
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
    slow,
    sse,
)
from tests.support import free_port

FAST = Backoff(initial=0.01, maximum=0.05)
CONTEXT = "Doc 1: the warranty lasts two years.\n\nDoc 2: returns within 30 days."


def client(url: str, **kwargs: Any) -> AsyncContextClient:
    kwargs.setdefault("backoff", FAST)
    return AsyncContextClient(url, **kwargs)


def _keys(obj: Any) -> set[str]:
    """Every dict key anywhere in a JSON value."""
    if isinstance(obj, dict):
        return set(obj) | {k for v in obj.values() for k in _keys(v)}
    if isinstance(obj, list):
        return {k for v in obj for k in _keys(v)}
    return set()


# -- (b) the header is a real HTTP header ----------------------------------------------

async def test_context_hash_is_a_real_header_not_in_the_body() -> None:
    with ScriptedServer([chat_ok("fine")]) as server:
        async with client(server.url, api_key="sk-test") as sdk:
            result = await sdk.chat(CONTEXT, "How long is the warranty?", model="m",
                                    system="Be brief.", max_tokens=8, temperature=0)
    seen = server.seen[0]
    assert seen.path == "/v1/chat/completions"
    assert seen.headers["X-Context-Hash"] == context_hash(CONTEXT)
    assert seen.headers["Authorization"] == "Bearer sk-test"
    assert not {k.lower() for k in _keys(seen.body)} & {"x-context-hash", "context_hash"}
    assert seen.body == {
        "model": "m", "stream": False, "max_tokens": 8, "temperature": 0,
        "messages": [{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": CONTEXT + "\n\nHow long is the warranty?"}],
    }
    assert (result.text, result.worker, result.reason) == ("fine", "w1", "warm")
    assert result.raw["object"] == "chat.completion"


async def test_completions_body_and_header() -> None:
    with ScriptedServer([completion_ok("two years")]) as server:
        async with client(server.url + "/v1/") as sdk:
            result = await sdk.complete(["Doc 1", "Doc 2"], "Q: warranty? A:", model="m")
    seen = server.seen[0]
    assert seen.path == "/v1/completions"
    assert seen.body["prompt"] == "Doc 1\n\nDoc 2\n\nQ: warranty? A:"
    assert seen.headers["X-Context-Hash"] == context_hash("Doc 1\n\nDoc 2")
    assert result.text == "two years"


async def test_no_context_sends_no_header_and_key_overrides() -> None:
    with ScriptedServer([chat_ok()]) as server:
        async with client(server.url) as sdk:
            await sdk.chat("", "hi", model="m")
            await sdk.chat(CONTEXT, "hi", model="m", key="00112233aabbccdd")
            with pytest.raises(ValueError):
                await sdk.chat(CONTEXT, "hi", model="m", key="xyz")
            with pytest.raises(TypeError):
                await sdk.chat(CONTEXT, "hi", model="m", messages=[])
    assert "X-Context-Hash" not in server.seen[0].headers
    assert server.seen[1].headers["X-Context-Hash"] == "00112233aabbccdd"
    assert len(server.seen) == 2


async def test_official_openai_package_sends_the_header() -> None:
    from openai import AsyncOpenAI

    from router.client import openai_headers

    with ScriptedServer([chat_ok("ok")]) as server:
        oai = AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        reply = await oai.chat.completions.create(
            model="m", messages=[{"role": "user", "content": CONTEXT + "\n\nQ"}],
            extra_headers=openai_headers(CONTEXT))
        await oai.close()
    assert reply.choices[0].message.content == "ok"
    assert server.seen[0].headers["X-Context-Hash"] == context_hash(CONTEXT)


# -- (a) retries -----------------------------------------------------------------------

async def test_503_with_retry_after_is_retried_until_success() -> None:
    script = [error(503, "busy", retry_after="0"), error(503, "busy", retry_after="0"),
              chat_ok("done")]
    with ScriptedServer(script) as server:
        async with client(server.url, max_retries=3) as sdk:
            result = await sdk.chat(CONTEXT, "q", model="m")
    assert server.attempts == 3
    assert result.text == "done"
    # Every attempt carries the same routing header and body.
    assert len({s.headers["X-Context-Hash"] for s in server.seen}) == 1
    assert all(s.body == server.seen[0].body for s in server.seen)


async def test_retry_after_is_honoured() -> None:
    with ScriptedServer([error(503, retry_after="1"), chat_ok()]) as server:
        async with client(server.url, backoff=Backoff(initial=0.0, maximum=0.0)) as sdk:
            start = time.monotonic()
            await sdk.chat(CONTEXT, "q", model="m")
            elapsed = time.monotonic() - start
    assert server.attempts == 2
    assert 1.0 <= elapsed < 3.0


async def test_retry_after_beyond_the_cap_is_raised_not_waited() -> None:
    backoff = Backoff(initial=0.01, max_retry_after=5)
    with ScriptedServer([error(503, retry_after="3600"), chat_ok()]) as server:
        async with client(server.url, backoff=backoff) as sdk:
            with pytest.raises(ServiceUnavailableError):
                await sdk.chat(CONTEXT, "q", model="m")
    assert server.attempts == 1


async def test_permanent_400_is_not_retried_and_carries_the_body() -> None:
    with ScriptedServer([error(400, "max_tokens must be positive",
                               err_type="invalid_request_error")]) as server:
        async with client(server.url, max_retries=5) as sdk:
            with pytest.raises(BadRequestError) as info:
                await sdk.chat(CONTEXT, "q", model="m", max_tokens=-1)
    assert server.attempts == 1
    exc = info.value
    assert (exc.status, exc.attempts) == (400, 1)
    assert exc.body == {"error": {"message": "max_tokens must be positive",
                                  "type": "invalid_request_error", "code": 400}}
    assert exc.type == "invalid_request_error"
    assert "max_tokens must be positive" in str(exc)


async def test_429_is_retried_then_raised_with_the_body() -> None:
    with ScriptedServer([error(429, "slow down", retry_after="0")]) as server:
        async with client(server.url, max_retries=2) as sdk:
            with pytest.raises(RateLimitError) as info:
                await sdk.chat(CONTEXT, "q", model="m")
    assert server.attempts == 3
    assert info.value.attempts == 3
    assert info.value.error["message"] == "slow down"


async def test_429_without_retry_after_uses_backoff() -> None:
    with ScriptedServer([error(429), chat_ok("ok")]) as server:
        async with client(server.url) as sdk:
            assert (await sdk.chat(CONTEXT, "q", model="m")).text == "ok"
    assert server.attempts == 2


@pytest.mark.parametrize(("status", "exc_type"), [(404, NotFoundError),
                                                   (502, InternalServerError),
                                                   (500, InternalServerError)])
async def test_other_errors_are_not_retried(status: int, exc_type: type) -> None:
    with ScriptedServer([error(status), chat_ok()]) as server:
        async with client(server.url) as sdk:
            with pytest.raises(exc_type) as info:
                await sdk.chat(CONTEXT, "q", model="m")
    assert server.attempts == 1
    assert info.value.status == status


async def test_non_json_error_body_is_wrapped_in_openai_shape() -> None:
    from aiohttp import web

    async def html(request: web.Request) -> web.Response:
        return web.Response(status=502, text="<html>Bad Gateway</html>")

    with ScriptedServer([html]) as server:
        async with client(server.url) as sdk:
            with pytest.raises(InternalServerError) as info:
                await sdk.chat(CONTEXT, "q", model="m")
    assert info.value.error["message"] == "<html>Bad Gateway</html>"
    assert info.value.error["code"] == 502


async def test_connect_error_is_retried_then_raised() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    async with client(url, max_retries=2) as sdk:
        with pytest.raises(APIConnectionError) as info:
            await sdk.chat(CONTEXT, "q", model="m")
    assert info.value.attempts == 3
    assert not isinstance(info.value, APITimeoutError)


async def test_read_timeout_raises_and_is_not_retried() -> None:
    with ScriptedServer([slow(2.0)]) as server:
        async with client(server.url, timeout=0.2, max_retries=3) as sdk:
            with pytest.raises(APITimeoutError):
                await sdk.chat(CONTEXT, "q", model="m")
    assert server.attempts == 1


# -- (c) streaming ---------------------------------------------------------------------

async def test_chat_stream_yields_text_deltas() -> None:
    events = [chat_chunk("", role="assistant"), chat_chunk("Two"), chat_chunk(" years"),
              chat_chunk(None)]
    with ScriptedServer([sse(events, split=7)]) as server:
        async with client(server.url) as sdk:
            stream = await sdk.chat(CONTEXT, "q", model="m", stream=True)
            assert (stream.worker, stream.reason) == ("w1", "warm")
            deltas = [d async for d in stream]
    assert deltas == ["Two", " years"]
    assert stream.text == "Two years"
    assert server.seen[0].body["stream"] is True
    assert server.seen[0].headers["X-Context-Hash"] == context_hash(CONTEXT)


async def test_completion_stream_yields_text_deltas() -> None:
    events = [completion_chunk("a"), completion_chunk("b"), completion_chunk("c")]
    with ScriptedServer([sse(events, split=1)]) as server:
        async with client(server.url) as sdk:
            stream = await sdk.complete(CONTEXT, "p", model="m", stream=True)
            assert [d async for d in stream] == ["a", "b", "c"]


async def test_raw_stream_yields_event_dicts() -> None:
    events = [chat_chunk("", role="assistant"), chat_chunk("x")]
    with ScriptedServer([sse(events)]) as server:
        async with client(server.url) as sdk:
            stream = await sdk.chat(CONTEXT, "q", model="m", stream=True, raw=True)
            items = [e async for e in stream]
    assert items == events


async def test_mid_stream_error_event_raises_stream_error() -> None:
    err = {"error": {"message": "worker w1 died", "type": "upstream_error", "code": 502}}
    with ScriptedServer([sse([chat_chunk("partial"), err], done=False)]) as server:
        async with client(server.url) as sdk:
            stream = await sdk.chat(CONTEXT, "q", model="m", stream=True)
            got: list[str] = []
            with pytest.raises(StreamError) as info:
                async for delta in stream:
                    got.append(delta)
    assert got == ["partial"]
    assert info.value.body == err
    assert info.value.type == "upstream_error"
    assert info.value.worker == "w1"
    assert server.attempts == 1  # a started stream is never retried


async def test_stream_cut_without_done_raises_stream_error() -> None:
    with ScriptedServer([sse([chat_chunk("a")], done=False)]) as server:
        async with client(server.url) as sdk:
            stream = await sdk.chat(CONTEXT, "q", model="m", stream=True)
            with pytest.raises(StreamError, match="without \\[DONE\\]"):
                async for _ in stream:
                    pass


async def test_stream_retries_before_the_first_byte() -> None:
    with ScriptedServer([error(503, retry_after="0"), sse([chat_chunk("ok")])]) as server:
        async with client(server.url) as sdk:
            stream = await sdk.chat(CONTEXT, "q", model="m", stream=True)
            assert [d async for d in stream] == ["ok"]
    assert server.attempts == 2


async def test_leaving_a_stream_early_closes_it() -> None:
    events = [chat_chunk(str(i)) for i in range(50)]
    with ScriptedServer([sse(events, split=40, delay=0.01), chat_ok("next")]) as server:
        async with client(server.url) as sdk:
            async with await sdk.chat(CONTEXT, "q", model="m", stream=True) as stream:
                assert await anext(stream) == "0"
            # The client stays usable after an abandoned stream.
            assert (await sdk.chat(CONTEXT, "q", model="m")).text == "next"


async def test_models() -> None:
    from aiohttp import web

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "a"}, {"id": "b"}]})

    with ScriptedServer([models]) as server:
        async with client(server.url) as sdk:
            assert await sdk.models() == ["a", "b"]
    assert server.seen[0].path == "/v1/models"


async def test_non_ascii_context_is_sent_as_utf8() -> None:
    context = "文書: 保証は二年間です。"
    with ScriptedServer([chat_ok()]) as server:
        async with client(server.url) as sdk:
            await sdk.chat(context, "保証は?", model="m")
    seen = server.seen[0]
    assert context.encode() in seen.raw
    assert seen.headers["X-Context-Hash"] == context_hash(context)


async def test_caller_owned_session_is_used_and_left_open() -> None:
    import aiohttp

    with ScriptedServer([chat_ok("mine")]) as server:
        async with aiohttp.ClientSession() as session:
            async with AsyncContextClient(server.url, session=session) as sdk:
                assert (await sdk.chat(CONTEXT, "q", model="m")).text == "mine"
            assert not session.closed


def test_one_client_across_two_event_loops() -> None:
    """A pool is bound to its loop: a second loop is refused with a clear error, unless the
    client was closed (which frees the pool) before the first loop ended."""
    import asyncio

    from router.client import PrefixRouterError

    with ScriptedServer([chat_ok("again")]) as server:
        sdk = client(server.url)

        async def ask_and_close() -> str:
            try:
                return (await sdk.chat(CONTEXT, "q", model="m")).text
            finally:
                await sdk.aclose()

        assert asyncio.run(ask_and_close()) == "again"
        assert asyncio.run(ask_and_close()) == "again"

        other = client(server.url)
        loop_a, loop_b = asyncio.new_event_loop(), asyncio.new_event_loop()
        try:
            assert loop_a.run_until_complete(other.chat(CONTEXT, "q", model="m")).text
            with pytest.raises(PrefixRouterError, match="another event loop"):
                loop_b.run_until_complete(other.chat(CONTEXT, "q", model="m"))
            loop_a.run_until_complete(other.aclose())
        finally:
            loop_a.close()
            loop_b.close()
