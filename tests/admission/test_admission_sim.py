"""Admission against simulated vLLM workers (real processes): what waits in the router,
where it goes when capacity frees, in which order, and what a refused client is told."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from aiohttp.test_utils import TestClient

from tests.admission.conftest import admitting, body, queued, sim_metric, text, until
from tests.unit.fakes import metric

Reply = tuple[int, dict[str, str], Any]


async def ring_hashes(client: TestClient) -> dict[str, list[str]]:
    """Two X-Context-Hash values whose ring owner is each worker (tiny prompts, idle fleet)."""
    owners: dict[str, list[str]] = {}
    for i in range(64):
        key = f"{i:016x}"
        async with client.post("/v1/completions", json=body(f"probe {i}"),
                               headers={"X-Context-Hash": key}) as resp:
            owners.setdefault(resp.headers["X-Prefix-Router-Worker"], []).append(key)
        if len(owners) == 2 and all(len(keys) >= 2 for keys in owners.values()):
            return owners
    raise AssertionError(f"too few keys for some worker: {owners}")


async def post(client: TestClient, payload: dict[str, Any], **headers: str) -> Reply:
    async with client.post("/v1/completions", json=payload, headers=headers) as resp:
        return resp.status, dict(resp.headers), await resp.json()


def admitted(client: TestClient, path: str) -> Any:
    return metric(client, "prefix_router_admission_admitted_total", path=path)


async def dispatched_directly(client: TestClient, count: float) -> None:
    async def done() -> bool:
        return await admitted(client, "direct") >= count
    await until(done, f"{count:g} requests dispatched directly")


async def some_queued(client: TestClient, count: float = 1) -> None:
    async def done() -> bool:
        return await queued(client) >= count
    await until(done, f"{count:g} requests queued in the router")


async def test_a_queued_request_goes_to_the_warm_worker_once_capacity_frees(sims) -> None:
    async with admitting(sims(2)) as client:
        owner = await ring_hashes(client)
        base = await admitted(client, "direct")
        doc = text("doc", 1800)  # 1,800 engine tokens
        # as many bytes, so the router predicts the two equal, but 3,300 engine tokens: w0
        # (computing the document) is done first, and its first byte makes it warm
        filler = " ".join(f"f{i % 10}" for i in range(len(doc) // 3))
        busy = [asyncio.create_task(post(client, body(filler),
                                         **{"X-Context-Hash": owner["w1"][0]}))]
        await dispatched_directly(client, base + 1)
        busy.append(asyncio.create_task(post(client, body(doc + " first"),
                                             **{"X-Context-Hash": owner["w0"][0]})))
        await dispatched_directly(client, base + 2)
        # cold when it arrives and at home on w1's ring point, where arrival-time routing
        # sends it; only the residency known when it is dispatched sends it to w0
        second = asyncio.create_task(post(client, body(doc + " second"),
                                          **{"X-Context-Hash": owner["w1"][1]}))
        await some_queued(client)
        status, headers, answer = await second
        assert status == 200
        assert headers["X-Prefix-Router-Worker"] == "w0"
        assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] >= 1500
        assert await admitted(client, "queued") == 1
        await asyncio.gather(*busy)


async def test_a_client_gone_while_queued_leaves_the_queue_and_reaches_no_worker(sims) -> None:
    (sim,) = sims(1)
    async with admitting([sim]) as client:
        busy = asyncio.create_task(post(client, body(text("fill", 3000))))
        await dispatched_directly(client, 1)
        gone = asyncio.create_task(post(client, body(text("gone", 500), stream=True)))
        await some_queued(client)
        gone.cancel()  # closes the connection: the router's handler is cancelled

        async def left() -> bool:
            return await metric(client, "prefix_router_admission_abandoned_total") == 1
        await until(left, "the request to leave the queue")
        assert await queued(client) == 0
        assert (await busy)[0] == 200
        assert await sim_metric(sim, "vllm:request_success_total") == 1  # the filler only
        assert await admitted(client, "queued") == 0


async def test_a_more_urgent_request_is_dispatched_first(sims) -> None:
    (sim,) = sims(1)
    async with admitting([sim]) as client:
        busy = asyncio.create_task(post(client, body(text("fill", 2000))))
        await dispatched_directly(client, 1)
        order: list[str] = []

        async def send(name: str, payload: dict[str, Any], **headers: str) -> None:
            status, _, _ = await post(client, payload, **headers)
            assert status == 200
            order.append(name)

        low = asyncio.create_task(send("low", body(text("low", 2000), priority=5)))
        await some_queued(client, 1)
        urgent = asyncio.create_task(send("urgent", body(text("urg", 2000)),
                                          **{"X-Priority": "-1"}))
        await some_queued(client, 2)
        await asyncio.gather(busy, low, urgent)
        assert order == ["urgent", "low"]


async def test_retry_after_grows_with_the_queue_ahead(sims) -> None:
    (sim,) = sims(1)
    # the router's estimate: ~4 bytes a token; 3,000-token requests queue, 6,000 do not fit
    async with admitting([sim], max_queue_tokens=8000) as client:
        prompts = itertools.count()

        def sized(tokens: int) -> dict[str, Any]:
            # a prompt of its own: one that shares the prefix of a request still
            # prefilling counts that prefix as cached (router/routing/signals/residency.py)
            return body(f"r{next(prompts)} " + " ".join(["abc"] * tokens))

        waiting = [asyncio.create_task(post(client, sized(3000)))]
        await dispatched_directly(client, 1)
        retry_after: list[int] = []
        for n in (1, 2):
            waiting.append(asyncio.create_task(post(client, sized(3000))))
            await some_queued(client, n)
            status, headers, error = await post(client, sized(6000))
            assert status == 429
            assert error["error"]["type"] == "rate_limit_error"
            assert error["error"]["code"] == "queue_full"
            retry_after.append(int(headers["Retry-After"]))
        # one more 3,000-token request ahead: ~1.7 s more at the fleet's 1,800 tokens/s
        assert retry_after[1] > retry_after[0] >= 1
        for task in waiting:
            task.cancel()


async def test_a_queued_stream_gets_sse_keepalives_then_its_answer(sims) -> None:
    (sim,) = sims(1)
    async with admitting([sim], queue_keepalive_s=0.05) as client:
        busy = asyncio.create_task(post(client, body(text("fill", 3000))))
        await dispatched_directly(client, 1)
        async with client.post("/v1/completions",
                               json=body(text("wait", 500), stream=True)) as resp:
            assert resp.status == 200
            lines = [line async for line in resp.content if line.strip()]
        assert lines[0] == b": queued\n"
        data = [line for line in lines if line.startswith(b"data: ")]
        assert data[-1] == b"data: [DONE]\n" and len(data) >= 2
        assert await admitted(client, "queued") == 1
        await busy
