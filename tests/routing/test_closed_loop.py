"""The closed loop against the simulated engine: an eviction the router did not see shows
up in the predicted-vs-actual error, and the router stops counting that worker warm."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from router.routing import keys
from router.server.state import ROUTER
from tests.support import free_port, spawn, stop, wait_http
from tests.unit.fakes import metric, router_client

MODEL = "sim-model"


def document(name: str) -> str:
    return " ".join(f"{name}{i % 97}" for i in range(700))  # ~700 tokens, ~16 router blocks


def completion(doc: str, question: str) -> dict:
    return {"model": MODEL, "prompt": doc + " question " + question, "max_tokens": 4}


class SimWorker:
    """A real simulated vLLM (engine_worker.sim) in its own process."""

    name = "w0"

    def __init__(self) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.proc = spawn(["-m", "engine_worker.sim", "--port", str(port), "--model", MODEL,
                           "--time-scale", "0.01", "--log-level", "WARNING"])
        wait_http(self.url + "/health", proc=self.proc)


@pytest.fixture
async def sim() -> AsyncIterator[SimWorker]:
    worker = SimWorker()
    yield worker
    stop(worker.proc)


async def test_an_unseen_eviction_shows_in_the_error_and_the_worker_is_no_longer_warm(
        sim: SimWorker) -> None:
    older, newer = document("alpha"), document("beta")
    async with router_client([sim], policy="predicted_ttft") as client, \
            aiohttp.ClientSession() as s:
        for doc in (older, newer):  # both become resident on w0, the older first
            async with client.post("/v1/completions", json=completion(doc, "one")) as resp:
                assert resp.status == 200
        async with client.post("/v1/completions", json=completion(newer, "two")) as resp:
            body = await resp.json()
            assert body["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # warm, as told
        assert await metric(client, "prefix_router_residency_corrections_total",
                            worker="w0") == 0

        async with s.post(sim.url + "/reset_prefix_cache") as resp:  # the engine evicts all
            assert resp.status == 200

        error_before = await metric(client, "prefix_router_cache_prediction_error_ratio_sum")
        async with client.post("/v1/completions", json=completion(newer, "three")) as resp:
            body = await resp.json()
            assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # cold now
        # the router predicted most of the prompt cached: the error says it was wrong
        error_after = await metric(client, "prefix_router_cache_prediction_error_ratio_sum")
        assert error_after - error_before > 0.5
        assert await metric(client, "prefix_router_residency_corrections_total",
                            worker="w0") == 1
        assert await metric(client, "prefix_router_residency_dropped_blocks_total") > 0

        # the older document was evicted too (the engine's LRU drops older first): the next
        # decision for it no longer counts w0 as warm
        pipeline = client.server.app[ROUTER].pipeline
        chain = keys.prompt_key((older + " question four").encode(), MODEL,
                                pipeline.block_chars, pipeline.max_blocks,
                                pipeline.key_blocks).chain
        assert await pipeline.residency.match(chain, ["w0"]) == {}
        async with client.post("/v1/completions", json=completion(older, "four")) as resp:
            assert resp.headers["X-Prefix-Router-Reason"] != "warm"
            assert (await resp.json())["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        # and the newer one, computed again just now, is warm again where it was served
        assert await pipeline.residency.match(
            keys.prompt_key((newer + " question five").encode(), MODEL, pipeline.block_chars,
                            pipeline.max_blocks, pipeline.key_blocks).chain, ["w0"])



async def test_the_predicted_ttft_header_falls_once_the_prefix_is_warm(sim: SimWorker) -> None:
    doc = document("gamma")
    async with router_client([sim], policy="predicted_ttft") as client:
        predicted = []
        for question in ("one", "two"):  # cold, then warm on the same worker
            async with client.post("/v1/completions", json=completion(doc, question)) as resp:
                assert resp.status == 200
                predicted.append(float(resp.headers["X-Prefix-Router-Predicted-TTFT-Ms"]))
        assert 0 < predicted[1] < predicted[0]  # the warm request has less to prefill
    async with router_client([sim], policy="round_robin") as client, \
            client.post("/v1/completions", json=completion(doc, "three")) as resp:
        assert "X-Prefix-Router-Predicted-TTFT-Ms" not in resp.headers  # predicts none


async def test_a_prompt_denser_than_the_learned_mean_is_not_taken_for_an_eviction(
        sim: SimWorker) -> None:
    """Six bytes a token against the ~4 the router starts from: the prediction, converted at
    the mean, is ~1.5x what the engine reused from a prefix it did hold. Counted at the
    prompt's own bytes per token (the answer gives its token count) nothing was evicted."""
    dense = " ".join(f"d{i:04d}" for i in range(1200))  # one 6-byte token a word
    async with router_client([sim], policy="predicted_ttft") as client:
        for question in ("one", "two"):
            async with client.post("/v1/completions", json=completion(dense, question)) as resp:
                body = await resp.json()
        assert body["usage"]["prompt_tokens_details"]["cached_tokens"] >= 1100  # warm
        assert await metric(client, "prefix_router_residency_corrections_total",
                            worker="w0") == 0
        pipeline = client.server.app[ROUTER].pipeline
        chain = keys.prompt_key((dense + " question three").encode(), MODEL,
                                pipeline.block_chars, pipeline.max_blocks,
                                pipeline.key_blocks).chain
        assert (await pipeline.residency.match(chain, ["w0"]))["w0"] >= 25  # still warm
