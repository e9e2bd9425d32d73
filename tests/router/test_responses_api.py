"""The Responses API through the router with the official ``openai`` package (issue 16,
acceptance 1, simulator half; the vLLM half is tests/engine/test_api_vllm.py).

Each simulated worker keeps its responses in its own memory, as vLLM does, so a follow-up,
a retrieve or a cancel that reached any other worker would fail with its 404.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import aiohttp
import pytest
from openai import AsyncOpenAI, NotFoundError

from tests.router.sim_fleet import MODEL, sim_fleet

DOC = " ".join(f"passage {i} says the cache holds block {i * 7}." for i in range(120))
WORKER = "X-Prefix-Router-Worker"


def client(url: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)


async def test_create_stream_follow_ups_retrieve_and_cancel_reach_the_maker() -> None:
    async with sim_fleet(4) as fleet:
        oai = client(fleet.url)
        raw = await oai.responses.with_raw_response.create(
            model=MODEL, instructions="Answer from the document.", input=DOC + " Q: what?",
            max_output_tokens=4)
        first, maker = raw.parse(), raw.headers[WORKER]
        assert first.id.startswith("resp_") and first.status == "completed"
        assert first.output_text and first.usage.input_tokens > 100

        served: Counter[str] = Counter()
        for turn in range(50):
            raw = await oai.responses.with_raw_response.create(
                model=MODEL, previous_response_id=first.id, input=f"follow-up {turn}",
                max_output_tokens=2)
            served[raw.headers[WORKER]] += 1
            assert raw.headers["X-Prefix-Router-Reason"] == "pinned"
            assert raw.parse().previous_response_id == first.id
        assert served == {maker: 50}

        stream = await oai.responses.create(model=MODEL, input=DOC + " Q: streamed?",
                                            max_output_tokens=5, stream=True)
        events = [event async for event in stream]
        assert events[0].type == "response.created" and events[-1].type == "response.completed"
        streamed = events[-1].response
        assert streamed.output_text == "".join(
            e.delta for e in events if e.type == "response.output_text.delta")
        again = await oai.responses.retrieve(streamed.id)  # learned from the stream
        assert again.id == streamed.id and again.output_text == streamed.output_text

        long = await oai.responses.create(model=MODEL, input="write at length",
                                          max_output_tokens=8000, background=True)
        assert long.status in ("queued", "in_progress")
        cancelled = await oai.responses.cancel(long.id)
        assert cancelled.status == "cancelled"
        assert (await oai.responses.retrieve(long.id)).status == "cancelled"
        await oai.close()


async def test_a_gone_maker_is_a_404_and_nothing_is_sent_elsewhere() -> None:
    async with sim_fleet(2) as fleet:
        oai = client(fleet.url)
        raw = await oai.responses.with_raw_response.create(model=MODEL, input=DOC,
                                                           max_output_tokens=2)
        made, maker = raw.parse(), raw.headers[WORKER]
        pool = fleet.state().pool
        other = next(w for w in pool if w.id != maker)
        routed_before = other.routed
        pool.remove(maker)
        for call in (oai.responses.retrieve(made.id),
                     oai.responses.create(model=MODEL, previous_response_id=made.id,
                                          input="and then?"),
                     oai.responses.cancel(made.id)):
            with pytest.raises(NotFoundError) as caught:
                await call
            error = caught.value.body
            assert error["code"] == "response_worker_gone" and maker in error["message"]
            assert error["type"] == "not_found_error"
        assert other.routed == routed_before  # never routed elsewhere
        with pytest.raises(NotFoundError) as caught:
            await oai.responses.retrieve("resp_never_made")
        assert caught.value.body["code"] == "response_not_found"
        await oai.close()


async def test_router_replicas_share_response_owners_through_redis(redis_server) -> None:
    async with sim_fleet(3, routers=2, redis_url=redis_server.url) as fleet:
        a, b = client(fleet.url), client(str(fleet.extra_routers[0].make_url("")).rstrip("/"))
        raw = await a.responses.with_raw_response.create(model=MODEL, input=DOC,
                                                         max_output_tokens=2)
        made, maker = raw.parse(), raw.headers[WORKER]
        for _ in range(500):  # the owner is written to Redis off the request path
            if redis_server.client().exists(f"prefix-router:response:{made.id}"):
                break
            await asyncio.sleep(0.02)
        for _ in range(5):
            raw = await b.responses.with_raw_response.create(
                model=MODEL, previous_response_id=made.id, input="more", max_output_tokens=2)
            assert raw.headers[WORKER] == maker
        ttl = redis_server.client().ttl(f"prefix-router:response:{made.id}")
        assert 0 < ttl <= 86400
        await a.close()
        await b.close()


async def test_bad_previous_response_id_is_a_400() -> None:
    async with sim_fleet(1) as fleet, aiohttp.ClientSession() as http:
        async with http.post(fleet.url + "/v1/responses",
                             json={"model": MODEL, "input": "x",
                                   "previous_response_id": 7}) as resp:
            assert resp.status == 400
            assert (await resp.json())["error"]["code"] == "invalid_previous_response_id"
        async with http.post(fleet.url + "/v1/responses",
                             json={"model": MODEL, "input": 5}) as resp:
            assert resp.status == 400
            assert (await resp.json())["error"]["type"] == "invalid_request_error"
