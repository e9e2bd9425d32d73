"""LoRA adapters (issue 16, acceptance 4), on the simulator: it lists loaded adapters in
/v1/models with their parent as vLLM does, and keys an adapter's blocks apart from the
base model's (vLLM's ("lora", name, path) extra keys). The router learns adapters from the
listing, routes an adapter request only to workers that loaded it, predicts from the
adapter's own residency, and loads a configured adapter when no worker has it."""

from __future__ import annotations

import aiohttp

from tests.router.sim_fleet import MODEL, post, sim_fleet

DOC = " ".join(f"clause {i}: the adapter reads the contract." for i in range(120))


async def load(http: aiohttp.ClientSession, url: str, name: str) -> None:
    async with http.post(url + "/v1/load_lora_adapter",
                         json={"lora_name": name, "lora_path": f"/adapters/{name}"}) as resp:
        assert resp.status == 200


async def test_adapter_requests_go_only_where_it_is_loaded_on_its_own_residency() -> None:
    async with sim_fleet(3) as fleet, aiohttp.ClientSession() as http:
        for worker in ("w1", "w2"):
            await load(http, fleet.urls[worker], "legal")
        await fleet.state().health.check_all()  # type: ignore[union-attr]
        async with http.get(fleet.url + "/v1/models") as resp:
            cards = {c["id"]: c for c in (await resp.json())["data"]}
        assert cards["legal"]["parent"] == MODEL and "parent" not in cards[MODEL]
        assert fleet.state().pool.adapter("legal").path == "/adapters/legal"  # type: ignore[union-attr]

        served = set()
        for i in range(12):
            body = {"model": "legal", "prompt": f"case {i}: " + DOC[: 200 + 40 * i],
                    "max_tokens": 1}
            status, _, headers = await post(http, fleet.url + "/v1/completions", body)
            assert status == 200
            served.add(headers["X-Prefix-Router-Worker"])
        assert served <= {"w1", "w2"} and served

        base = {"model": MODEL, "prompt": DOC, "max_tokens": 1}
        await post(http, fleet.url + "/v1/completions", base)
        _, answer, _ = await post(http, fleet.url + "/v1/completions", base)
        assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # base is warm
        adapted = {**base, "model": "legal"}
        _, answer, headers = await post(http, fleet.url + "/v1/completions", adapted)
        assert headers["X-Prefix-Router-Reason"] == "ring"  # the base's blocks don't count
        assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        home = headers["X-Prefix-Router-Worker"]
        _, answer, headers = await post(http, fleet.url + "/v1/completions", adapted)
        assert headers["X-Prefix-Router-Worker"] == home
        assert headers["X-Prefix-Router-Reason"] in ("warm", "home")
        assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


async def test_a_configured_adapter_is_loaded_when_no_worker_has_it() -> None:
    async with sim_fleet(2, lora_adapters=(("support", "/adapters/support"),)) as fleet, \
            aiohttp.ClientSession() as http:
        body = {"model": "support", "prompt": DOC, "max_tokens": 1}
        status, _, headers = await post(http, fleet.url + "/v1/completions", body)
        assert status == 200
        loader = headers["X-Prefix-Router-Worker"]
        assert fleet.sims[loader].adapters == {"support": "/adapters/support"}
        other = next(name for name in fleet.sims if name != loader)
        assert fleet.sims[other].adapters == {}
        for _ in range(3):
            _, _, headers = await post(http, fleet.url + "/v1/completions", body)
            assert headers["X-Prefix-Router-Worker"] == loader
        status, error, _ = await post(http, fleet.url + "/v1/completions",
                                      {**body, "model": "unlisted"})
        assert status == 404 and error["error"]["code"] == "model_not_found"
        assert all("unlisted" not in sim.adapters for sim in fleet.sims.values())
