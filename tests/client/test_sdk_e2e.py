"""The SDK and the official openai package against a running router and simulated workers.

Routing is read from the `X-Prefix-Router-Worker` response header. Requests are sequential,
so load never exceeds the bound and routing is decided by the key alone.
"""

from __future__ import annotations

import uuid

import pytest
from openai import AsyncOpenAI, OpenAI

from router.client import (
    AsyncContextClient,
    ContextClient,
    NotFoundError,
    context_hash,
    openai_headers,
)
from tests.client.conftest import SIM_MODEL, Fleet

WORKER_IDS = {"w0", "w1", "w2"}


def rag_context(tag: str) -> list[str]:
    """Retrieved documents, long enough to span many KV blocks."""
    return [f"Document {i} about {tag}: " + f"fact {i} of {tag}. " * 40 for i in range(3)]


def test_sync_sdk_same_context_same_worker(fleet: Fleet) -> None:
    docs = rag_context(f"sync-{uuid.uuid4()}")
    workers: list[str | None] = []
    with ContextClient(fleet.router_url) as sdk:
        for question in ("What is fact 1?", "What is fact 2?", "Summarise."):
            result = sdk.chat(docs, question, model=SIM_MODEL, max_tokens=8)
            assert result.text and result.raw["choices"]
            workers.append(result.worker)
        with sdk.chat(docs, "Stream it.", model=SIM_MODEL, stream=True, max_tokens=8) as stream:
            deltas = list(stream)
        assert deltas and "".join(deltas) == stream.text
        workers.append(stream.worker)
        completion = sdk.complete(docs, "Q: fact 0?\nA:", model=SIM_MODEL, max_tokens=8)
        assert completion.text
        workers.append(completion.worker)
        comp_stream = sdk.complete(docs, "Q: fact 2?\nA:", model=SIM_MODEL, stream=True,
                                   max_tokens=8)
        assert list(comp_stream)
        workers.append(comp_stream.worker)
    assert len(set(workers)) == 1, workers
    assert workers[0] in WORKER_IDS


async def test_async_sdk_same_context_same_worker(fleet: Fleet) -> None:
    docs = rag_context(f"async-{uuid.uuid4()}")
    workers: list[str | None] = []
    reasons: list[str | None] = []
    async with AsyncContextClient(fleet.router_url) as sdk:
        for i in range(3):
            result = await sdk.chat(docs, f"Question {i}?", model=SIM_MODEL, max_tokens=8)
            workers.append(result.worker)
            reasons.append(result.reason)
        stream = await sdk.chat(docs, "Stream.", model=SIM_MODEL, stream=True, max_tokens=8)
        assert [d async for d in stream]
        workers.append(stream.worker)
        raw = await sdk.complete(docs, "Go:", model=SIM_MODEL, stream=True, raw=True,
                                 max_tokens=8)
        events = [e async for e in raw]
        assert events and all("choices" in e for e in events)
        workers.append(raw.worker)
    assert len(set(workers)) == 1, workers
    assert reasons[-1] == "warm", reasons  # the context is resident after the first request


def test_different_contexts_spread(fleet: Fleet) -> None:
    run = uuid.uuid4()
    with ContextClient(fleet.router_url) as sdk:
        workers = {sdk.chat(rag_context(f"spread-{run}-{i}"), "Q?", model=SIM_MODEL,
                            max_tokens=4).worker for i in range(20)}
    assert len(workers) >= 2, workers
    assert workers <= WORKER_IDS


def test_router_routes_on_the_header_not_the_body(fleet: Fleet) -> None:
    """Unrelated prompts sharing one X-Context-Hash all land on one worker: the router saw
    the header (prompts this different would otherwise spread, as the test above shows)."""
    key = context_hash(str(uuid.uuid4()))
    with ContextClient(fleet.router_url) as sdk:
        workers = {sdk.chat(rag_context(f"hdr-{uuid.uuid4()}"), "Q?", model=SIM_MODEL,
                            key=key, max_tokens=4).worker for _ in range(10)}
    assert len(workers) == 1, workers


def test_typed_error_from_the_router(fleet: Fleet) -> None:
    with ContextClient(fleet.router_url) as sdk:
        assert SIM_MODEL in sdk.models()
        with pytest.raises(NotFoundError) as info:
            sdk.chat("ctx", "q", model="no-such-model", max_tokens=4)
    assert info.value.status == 404
    assert info.value.error.get("message")
    assert info.value.attempts == 1


def test_official_openai_package_chat_and_stream(fleet: Fleet) -> None:
    context = "\n\n".join(rag_context(f"openai-{uuid.uuid4()}"))
    messages = [{"role": "user", "content": f"{context}\n\nWhat is fact 1?"}]
    client = OpenAI(base_url=fleet.router_url + "/v1", api_key="x", max_retries=0)
    workers: list[str | None] = []

    raw = client.chat.completions.with_raw_response.create(
        model=SIM_MODEL, messages=messages, max_tokens=8,
        extra_headers=openai_headers(context))
    reply = raw.parse()
    assert reply.choices[0].message.content
    workers.append(raw.headers.get("x-prefix-router-worker"))

    raw_stream = client.chat.completions.with_raw_response.create(
        model=SIM_MODEL, messages=messages, max_tokens=8, stream=True,
        extra_headers=openai_headers(context))
    text = "".join(chunk.choices[0].delta.content or ""
                   for chunk in raw_stream.parse() if chunk.choices)
    assert text
    workers.append(raw_stream.headers.get("x-prefix-router-worker"))

    session = client.with_options(default_headers=openai_headers(context))
    raw = session.completions.with_raw_response.create(
        model=SIM_MODEL, prompt=f"{context}\n\nQ: fact 2?\nA:", max_tokens=8)
    assert raw.parse().choices[0].text
    workers.append(raw.headers.get("x-prefix-router-worker"))
    client.close()

    assert len(set(workers)) == 1 and workers[0] in WORKER_IDS, workers


async def test_official_async_openai_stream(fleet: Fleet) -> None:
    context = "\n\n".join(rag_context(f"aopenai-{uuid.uuid4()}"))
    client = AsyncOpenAI(base_url=fleet.router_url + "/v1", api_key="x", max_retries=0,
                         default_headers=openai_headers(context))
    stream = await client.chat.completions.create(
        model=SIM_MODEL, messages=[{"role": "user", "content": context + "\n\nQ?"}],
        max_tokens=8, stream=True)
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    await client.close()
    assert text
