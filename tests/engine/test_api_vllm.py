"""Issue 16 against the two real vLLM workers (the package's shared ``vllm_fleet``):

1. the Responses API through the router with the ``openai`` package: create (streamed and
   not), follow-ups with ``previous_response_id``, retrieve and cancel all reach the worker
   that made the response (vLLM keeps it in that server's memory: the other answers 404);
2. ``/tokenize`` and ``/detokenize`` pass through unchanged;
3. ``cache_salt``: two tenants sending the same prompt with different salts never share a
   block in the engine, and the router in precise mode predicts exactly what the engine
   reports cached (``usage.prompt_tokens_details.cached_tokens``) for every request.
Skips only when .venv-vllm is absent.
"""

from __future__ import annotations

from collections import Counter

import aiohttp
import pytest
from openai import AsyncOpenAI, BadRequestError

from router.server.state import ROUTER
from tests.engine.test_router_vllm import TIMEOUT, router
from tests.engine.vllm_fleet import (
    BLOCK,
    MODEL_NAME,
    Fleet,
    document,
    eventually,
    reset_caches,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # the first one starts the fleet
pytest.importorskip("transformers")
WORKER = "X-Prefix-Router-Worker"
PREDICTED = "X-Prefix-Router-Predicted-Cached"


async def test_responses_api_reaches_the_maker_on_vllm(vllm_fleet: Fleet) -> None:
    async with router(vllm_fleet, "predicted_ttft") as client:
        oai = AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key="x", max_retries=0,
                          timeout=300)
        raw = await oai.responses.with_raw_response.create(
            model=MODEL_NAME, instructions="Answer briefly.", input=document(7, 120),
            max_output_tokens=3, temperature=0)
        first, maker = raw.parse(), raw.headers[WORKER]
        assert first.id and first.status in ("completed", "incomplete")  # max_output_tokens
        served: Counter[str] = Counter()
        for turn in range(6):
            raw = await oai.responses.with_raw_response.create(
                model=MODEL_NAME, previous_response_id=first.id, input=f"and {turn}?",
                max_output_tokens=2, temperature=0)
            served[raw.headers[WORKER]] += 1
            assert raw.parse().status in ("completed", "incomplete")
        assert served == {maker: 6}

        stream = await oai.responses.create(model=MODEL_NAME, input=document(8, 80),
                                            max_output_tokens=3, stream=True, temperature=0)
        events = [event async for event in stream]
        assert events[0].type == "response.created" and events[-1].type == "response.completed"
        streamed = events[-1].response
        assert (await oai.responses.retrieve(streamed.id)).id == streamed.id
        assert (await oai.responses.retrieve(first.id)).id == first.id
        with pytest.raises(BadRequestError, match="Cannot cancel a synchronous response"):
            await oai.responses.cancel(first.id)  # the maker's own answer; another says 404
        await oai.close()


def test_prefix_worker_checked_this_vllm(vllm_fleet: Fleet) -> None:
    """Each worker started only after its vLLM passed engine_worker/vllm_check.py."""
    for worker in vllm_fleet.workers.values():
        assert "KV events and block hashes as expected" in worker.log.read_text()


async def test_tokenize_and_detokenize_pass_through_on_vllm(vllm_fleet: Fleet) -> None:
    direct = next(iter(vllm_fleet.workers.values())).url
    body = {"model": MODEL_NAME, "prompt": document(3, 40)}
    async with router(vllm_fleet, "predicted_ttft") as client, \
            aiohttp.ClientSession(timeout=TIMEOUT) as http:
        async with http.post(direct + "/tokenize", json=body) as resp:
            expected = await resp.json()
        routed = await client.post("/tokenize", json=body)
        assert routed.status == 200 and routed.headers["X-Prefix-Router-Reason"] == "least_loaded"
        assert await routed.json() == expected
        back = await client.post("/detokenize", json={"model": MODEL_NAME,
                                                      "tokens": expected["tokens"]})
        assert back.status == 200 and (await back.json())["prompt"] == body["prompt"]


async def test_cache_salt_isolates_tenants_and_the_router_predicts_it(vllm_fleet: Fleet) -> None:
    prompt = document(11, 200)
    workers = vllm_fleet.workers
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
        await reset_caches(http, workers.values())
        async with router(vllm_fleet, "predicted_ttft", precise=True) as client:
            exact = client.server.app[ROUTER].precise.residency  # type: ignore[union-attr]

            async def send(salt: str | None, url: str | None = None
                           ) -> tuple[str, int, int, int]:
                """(worker, predicted, cached, prompt tokens); ``url``: straight to that
                engine, past the router (predicted -1)."""
                body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 1,
                        "temperature": 0, **({"cache_salt": salt} if salt else {})}
                if url is not None:
                    async with http.post(url + "/v1/completions", json=body) as resp:
                        assert resp.status == 200, await resp.text()
                        usage = (await resp.json())["usage"]
                    worker, predicted = url, -1
                else:
                    resp = await client.post("/v1/completions", json=body)
                    assert resp.status == 200, await resp.text()
                    usage = (await resp.json())["usage"]
                    worker, predicted = resp.headers[WORKER], int(resp.headers[PREDICTED])
                return (worker, predicted, usage["prompt_tokens_details"]["cached_tokens"],
                        usage["prompt_tokens"])

            home_a, predicted, cached, tokens = await send("tenant-a")
            assert predicted == cached == 0
            blocks = tokens // BLOCK
            await eventually(lambda: len(exact.resident(home_a)) >= blocks)
            again, predicted, cached, _ = await send("tenant-a")
            assert again == home_a and cached > 0 and predicted == cached

            home_b, predicted, cached, _ = await send("tenant-b")  # same prompt, other tenant
            assert predicted == cached == 0
            if home_b != home_a:  # the engine holding tenant a's blocks shares none with b
                assert (await send("tenant-b", workers[home_a].url))[2] == 0
            assert (await send(None, workers[home_a].url))[2] == 0  # nor unsalted
            await eventually(lambda: len(exact.resident(home_a)) >= 3 * blocks)
            for salt in ("tenant-a", "tenant-b", None):  # each warm in its own namespace
                worker, predicted, cached, _ = await send(salt)
                assert predicted == cached, (salt, worker, predicted, cached)
                assert cached > 0 or worker != home_a, (salt, worker, cached)
