"""Issue 16 against the two real vLLM workers (the package's shared ``vllm_fleet``):

1. the Responses API through the router with the ``openai`` package: create (streamed and
   not), follow-ups with ``previous_response_id``, retrieve and cancel all reach the worker
   that made the response (vLLM keeps it in that server's memory: the other answers 404);
2. ``/tokenize`` and ``/detokenize`` pass through unchanged;
3. ``cache_salt``: two tenants sending the same prompt with different salts never share a
   block in the engine, and the router in precise mode predicts exactly what the engine
   reports cached (``usage.prompt_tokens_details.cached_tokens``) for every request;
4. rerank (``/v1/rerank``, ``/rerank``) and ``/score`` reach the fleet's pooling worker (a
   one-label sequence classifier, the package's ``vllm_reranker``) and come back as vLLM
   made them; a bad rerank request gets vLLM's own 400 in OpenAI's shape;
5. LoRA (acceptance 4): the router learns worker a's adapter and its parent from
   /v1/models, sends every adapter request to a (the engines' own request counters say
   so), still spreads the base model over both, and in precise mode predicts the adapter's
   residency on the adapter's own blocks: the base model's warm prefix is 0 for the
   adapter, the adapter's own is exactly what the engine reports cached.
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
    ADAPTER,
    BLOCK,
    MODEL_NAME,
    RERANKER,
    Fleet,
    Worker,
    document,
    eventually,
    metric_sum,
    reset_caches,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # the first one starts the fleet
pytest.importorskip("transformers")
WORKER = "X-Prefix-Router-Worker"
REASON = "X-Prefix-Router-Reason"
PREDICTED = "X-Prefix-Router-Predicted-Cached"
RERANK = {"model": RERANKER, "query": "which block holds the warm prefix?",
          "documents": ["the warm prefix block", document(21, 30), document(22, 12)]}
SCORE = {"model": RERANKER, "text_1": "which block holds the warm prefix?",
         "text_2": ["the warm prefix block", document(23, 20)]}


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


async def test_rerank_and_score_reach_the_reranker_as_vllm_answers(
        vllm_fleet: Fleet, vllm_reranker: Worker) -> None:
    async with router(vllm_fleet, "predicted_ttft", more=[vllm_reranker]) as client, \
            aiohttp.ClientSession(timeout=TIMEOUT) as http:
        pool = client.server.app[ROUTER].pool
        await eventually(lambda: pool.healthy_count() == 3, within_s=60)
        assert [w.id for w in pool.candidates(RERANKER)] == ["reranker"]  # models learned
        for path, body in (("/v1/rerank", RERANK), ("/rerank", {**RERANK, "top_n": 2}),
                           ("/score", SCORE)):
            async with http.post(vllm_reranker.url + path, json=body) as resp:
                assert resp.status == 200, await resp.text()
                direct = await resp.json()
            routed = await client.post(path, json=body)
            assert routed.status == 200, await routed.text()
            assert routed.headers[WORKER] == "reranker"  # the one worker serving the model
            assert routed.headers[REASON] == "least_loaded"
            answer = await routed.json()
            for volatile in ("id", "created"):  # vLLM's own, new for every request
                direct.pop(volatile, None), answer.pop(volatile, None)
            assert answer == direct, path  # vLLM's scores, unchanged on the way back
            if "rerank" in path:
                scores = [r["relevance_score"] for r in answer["results"]]
                assert len(scores) == body.get("top_n", 3) and scores == sorted(scores)[::-1]
                assert {r["document"]["text"] for r in answer["results"]} <= set(
                    body["documents"])
            else:
                assert [d["index"] for d in answer["data"]] == [0, 1]
                assert all(d["object"] == "score" for d in answer["data"])
            assert answer["model"] == RERANKER and answer["usage"]["prompt_tokens"] > 0

        bad = {"model": RERANKER, "documents": ["no query"]}  # vLLM: body.query missing
        async with http.post(vllm_reranker.url + "/v1/rerank", json=bad) as resp:
            direct_status, direct = resp.status, await resp.json()
        routed = await client.post("/v1/rerank", json=bad)
        assert routed.status == direct_status == 400
        error = (await routed.json())["error"]
        assert error == direct["error"]
        assert {"message", "type", "code"} <= error.keys() and "query" in error["message"]


async def engine_requests(http: aiohttp.ClientSession, worker: Worker) -> float:
    """Requests the engine itself finished (vllm:request_success_total, every reason)."""
    async with http.get(worker.url + "/metrics") as resp:
        return metric_sum(await resp.text(), "vllm:request_success_total")


async def test_lora_adapter_goes_only_to_its_worker_on_its_own_residency(
        vllm_fleet: Fleet) -> None:
    workers = vllm_fleet.workers
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
        await reset_caches(http, workers.values())
        async with router(vllm_fleet, "predicted_ttft", precise=True) as client:
            state = client.server.app[ROUTER]
            pool, exact = state.pool, state.precise.residency  # type: ignore[union-attr]
            await eventually(lambda: pool.healthy_count() == 2 and pool.adapter(ADAPTER),
                             within_s=60)
            cards = {c["id"]: c for c in (await (await client.get("/v1/models")).json())["data"]}
            assert cards[ADAPTER]["parent"] == MODEL_NAME and "parent" not in cards[MODEL_NAME]
            assert pool.adapter(ADAPTER).path == str(vllm_fleet.adapter_dir)  # type: ignore[union-attr]

            async def send(model: str, prompt: str) -> tuple[str, int, int, int]:
                """(worker, predicted, cached, prompt tokens) of one routed completion."""
                body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0}
                resp = await client.post("/v1/completions", json=body)
                assert resp.status == 200, await resp.text()
                answer = await resp.json()
                assert answer["model"] == model
                usage = answer["usage"]
                return (resp.headers[WORKER], int(resp.headers[PREDICTED]),
                        usage["prompt_tokens_details"]["cached_tokens"], usage["prompt_tokens"])

            async def counted(model: str, seeds: range) -> dict[str, float]:
                """Requests each engine finished while these went through the router."""
                before = {n: await engine_requests(http, w) for n, w in workers.items()}
                for seed in seeds:
                    await send(model, document(seed, 40))
                return {n: await engine_requests(http, w) - before[n] for n, w in workers.items()}

            assert await counted(ADAPTER, range(40, 46)) == {"a": 6, "b": 0}
            spread = await counted(MODEL_NAME, range(60, 68))
            assert spread["a"] > 0 and spread["b"] > 0 and sum(spread.values()) == 8, spread

            # The base model warm on a: an adapter request of the same prompt shares none of
            # its blocks in the engine, and the router, keyed on the adapter, predicts none.
            prompt = document(70, 150)
            held = exact.count("a")
            async with http.post(workers["a"].url + "/v1/completions", json={
                    "model": MODEL_NAME, "prompt": prompt, "max_tokens": 1}) as resp:
                assert resp.status == 200, await resp.text()
                tokens = (await resp.json())["usage"]["prompt_tokens"]
            await eventually(lambda: exact.count("a") >= held + tokens // BLOCK)
            held = exact.count("a")  # the base's blocks, seen by the router through events
            worker, predicted, cached, _ = await send(ADAPTER, prompt)
            assert (worker, predicted, cached) == ("a", 0, 0)
            await eventually(lambda: exact.count("a") >= held + tokens // BLOCK)
            worker, predicted, cached, _ = await send(ADAPTER, prompt)
            assert worker == "a" and cached > 0 and predicted == cached
