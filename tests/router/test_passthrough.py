"""Every pass-through family through the router to simulated workers (issue 16, acceptance 2):
rerank (three paths), score (two), pooling, classify, embeddings, tokenize, detokenize,
Anthropic Messages (keyed on its prompt); the worker's answer comes back as it made it, the
least-loaded worker serves, and a dead worker's share fails over."""

from __future__ import annotations

import aiohttp

from tests.router.sim_fleet import MODEL, post, sim_fleet

DOC = " ".join(f"line {i}: the router keeps context {i % 9} warm." for i in range(80))
FAMILIES = {
    "/v1/rerank": {"query": "warm cache", "documents": ["cold start", "a warm cache hit"]},
    "/rerank": {"query": "warm cache", "documents": ["cold start", "a warm cache hit"],
                "top_n": 1},
    "/v2/rerank": {"query": "warm", "documents": ["warm", "cold"]},
    "/score": {"text_1": "warm cache", "text_2": ["warm cache", "cold"]},
    "/v1/score": {"queries": "warm", "documents": ["warm", "cold"]},
    "/pooling": {"input": ["one", "two"]},
    "/classify": {"input": "classify me"},
    "/v1/embeddings": {"input": "embed me"},
    "/tokenize": {"prompt": "count these words"},
    "/detokenize": {"tokens": [5, 6, 7]},
    "/v1/messages/count_tokens": {"messages": [{"role": "user", "content": "hi"}]},
}


async def test_every_family_reaches_a_worker_and_answers_in_vllms_shape() -> None:
    async with sim_fleet(2) as fleet, aiohttp.ClientSession() as http:
        for path, body in FAMILIES.items():
            status, direct, _ = await post(http, fleet.urls["w0"] + path,
                                           {"model": MODEL, **body})
            assert status == 200, (path, direct)
            status, routed, headers = await post(http, fleet.url + path,
                                                 {"model": MODEL, **body})
            assert status == 200, (path, routed)
            assert headers["X-Prefix-Router-Reason"] == "least_loaded"
            _drop_volatile(direct), _drop_volatile(routed)
            assert routed == direct, path  # the same request reached a worker unchanged
        _, reranked, _ = await post(http, fleet.url + "/v1/rerank",
                                    {"model": MODEL, **FAMILIES["/v1/rerank"]})
        assert [r["index"] for r in reranked["results"]] == [1, 0]
        _, scored, _ = await post(http, fleet.url + "/score", {"model": MODEL,
                                                               **FAMILIES["/score"]})
        assert scored["data"][0]["score"] == 1.0 and scored["data"][1]["score"] == 0.0
        status, missing, _ = await post(http, fleet.url + "/v1/rerank",
                                        {"model": "nope", **FAMILIES["/v1/rerank"]})
        assert status == 404 and missing["error"]["code"] == "model_not_found"
        # a worker's own 400 for a bad field comes back as such (it was a 500, then a 502)
        status, bad, _ = await post(http, fleet.url + "/rerank",
                                    {"model": MODEL, **FAMILIES["/rerank"], "top_n": "1"})
        assert status == 400 and "top_n" in bad["error"]["message"]


def _drop_volatile(body: dict) -> None:
    for key in ("id", "created"):
        body.pop(key, None)


async def test_least_loaded_serves_and_a_dead_worker_fails_over() -> None:
    async with sim_fleet(2) as fleet, aiohttp.ClientSession() as http:
        pool = fleet.state().pool
        pool.get("w0").in_flight = 5  # type: ignore[union-attr]  # w0 is busy elsewhere
        for _ in range(4):
            _, _, headers = await post(http, fleet.url + "/v1/score",
                                       {"model": MODEL, **FAMILIES["/v1/score"]})
            assert headers["X-Prefix-Router-Worker"] == "w1"
        pool.get("w0").in_flight = 0  # type: ignore[union-attr]
    async with sim_fleet(2, health_interval_s=60) as fleet, aiohttp.ClientSession() as http:
        await fleet.servers["w0"].close()  # dies after its health check said yes
        reasons = set()
        for _ in range(3):
            status, _, headers = await post(http, fleet.url + "/tokenize",
                                            {"model": MODEL, "prompt": "x y"})
            assert status == 200 and headers["X-Prefix-Router-Worker"] == "w1"
            reasons.add(headers["X-Prefix-Router-Reason"])
        assert "failover" in reasons


async def test_messages_are_keyed_on_system_and_messages() -> None:
    async with sim_fleet(3) as fleet, aiohttp.ClientSession() as http:
        body = {"model": MODEL, "max_tokens": 3, "system": DOC,
                "messages": [{"role": "user", "content": "summarise"}]}
        status, first, headers = await post(http, fleet.url + "/v1/messages", body)
        assert status == 200 and first["type"] == "message" and first["content"][0]["text"]
        home = headers["X-Prefix-Router-Worker"]
        assert headers["X-Prefix-Router-Reason"] == "ring"
        follow = {**body, "messages": [*body["messages"],
                                       {"role": "assistant", "content": "ok"},
                                       {"role": "user", "content": "more"}], "stream": True}
        async with http.post(fleet.url + "/v1/messages", json=follow) as resp:
            raw = await resp.read()
            assert resp.headers["X-Prefix-Router-Worker"] == home
            assert resp.headers["X-Prefix-Router-Reason"] in ("warm", "home")
        assert b"event: message_start" in raw and b"event: message_stop" in raw
        assert fleet.sims[home].engine.counters.prefix_hits > 0  # the system prompt was warm
