"""Precise mode rebuilds exact residency on start from the workers' KV-event replay.

Real parts: two simulated vLLM workers (``python -m engine_worker.sim``, subprocesses)
publishing KV events over ZMQ with vLLM's replay socket, and the router on real HTTP. The
workers cache a prefix each before the router exists and publish nothing afterwards, so
the only way the router can know where the prefixes are is the replay it asks for when it
subscribes. No Redis. The router finds the feeds either in ``--kv-events`` or by asking
each worker's ``GET /kv_event_sources`` (as vLLM serves it; there the workers also demand
an API key, as vLLM's ``--api-key``, which the router presents).
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from subprocess import Popen

import pytest
from aiohttp.test_utils import TestClient, TestServer

from router.config import RouterConfig
from router.precise.exact import block_key
from router.protocol.block_hash import block_hashes
from router.server.app import build_app
from router.server.state import ROUTER
from tests.support import free_port, spawn, stop, wait_http

pytest.importorskip("transformers")
MODEL = "sim-precise"
BLOCK = 16
KEY = "sk-sim-precise"


@dataclass
class SimWorker:
    name: str
    port: int
    events: str
    replay: str
    proc: Popen
    feeds: str  # configured (--kv-events) or discovered (GET /kv_event_sources)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture(params=["configured", "discovered"])
def sims(request: pytest.FixtureRequest) -> Iterator[list[SimWorker]]:
    workers = []
    auth = ["--api-key", KEY] if request.param == "discovered" else []
    for name in ("w0", "w1"):
        port, events, replay = free_port(), free_port(), free_port()
        proc = spawn(["-m", "engine_worker.sim", "--port", str(port), "--model", MODEL,
                      "--profile", "tiny@l4", "--time-scale", "0.001",
                      "--kv-events-endpoint", f"tcp://*:{events}",
                      "--kv-events-replay-endpoint", f"tcp://*:{replay}",
                      "--kv-events-topic", "kv-events", *auth], env={"PYTHONHASHSEED": "0"})
        workers.append(SimWorker(name, port, f"tcp://127.0.0.1:{events}",
                                 f"tcp://127.0.0.1:{replay}", proc, request.param))
    try:
        for worker in workers:
            wait_http(worker.url + "/health", proc=worker.proc)
        yield workers
    finally:
        for worker in workers:
            stop(worker.proc)


def complete(url: str, prompt: list[int]) -> None:
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 1}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json",
                                          "Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200


def prompt(seed: int) -> list[int]:
    return [1 + (seed * 131 + i * 7) % 1000 for i in range(20 * BLOCK + 5)]


async def test_a_router_started_after_the_workers_cached_routes_to_the_warm_one(
        sims: list[SimWorker], tokenizer_dir: Path) -> None:
    prompts = {"w0": prompt(1), "w1": prompt(2)}
    for worker in sims:  # each worker computes its own prefix, with no router listening
        complete(worker.url, prompts[worker.name])
    discovered = sims[0].feeds == "discovered"
    config = RouterConfig(
        workers=tuple((w.name, w.url) for w in sims),
        tokenizers=((MODEL, str(tokenizer_dir)),), precise_block_size=BLOCK,
        kv_events=() if discovered else tuple((w.name, f"{w.events}|{w.replay}")
                                              for w in sims),
        upstream_api_key=KEY if discovered else "", health_interval_s=0.2)
    client = TestClient(TestServer(build_app(config)))
    await client.start_server()
    try:
        precise = client.server.app[ROUTER].precise
        assert precise is not None
        for worker in sims:  # the feed the router follows: given, or the worker's answer
            params = precise.feeds.params(worker.name)
            assert params is not None and (params.endpoint, params.replay_endpoint,
                                           params.topic) == (worker.events, worker.replay,
                                                             "kv-events")
        chains = {name: [block_key(h) for h in block_hashes(ids, BLOCK, seed="0")]
                  for name, ids in prompts.items()}
        deadline = time.monotonic() + 20
        while not all(precise.residency.match(name, chain) == len(chain)
                      for name, chain in chains.items()):
            assert time.monotonic() < deadline, "the replay never rebuilt the residency"
            await asyncio.sleep(0.05)
        for name, ids in prompts.items():
            resp = await client.post("/v1/completions",
                                     json={"model": MODEL, "prompt": ids, "max_tokens": 1})
            assert resp.status == 200, await resp.text()
            assert resp.headers["X-Prefix-Router-Worker"] == name
            # the whole prefix predicted cached: known from the replay, nothing else
            assert resp.headers["X-Prefix-Router-Predicted-Cached"] == str(20 * BLOCK)
        metrics = await (await client.get("/metrics")).text()
        for name in prompts:
            assert f'prefix_router_kv_events_total{{kind="resets",worker="{name}"}} 0.0' \
                in metrics
            replayed = next(line for line in metrics.splitlines() if line.startswith(
                f'prefix_router_kv_events_total{{kind="replayed",worker="{name}"}}'))
            assert float(replayed.rsplit(" ", 1)[1]) >= 1
    finally:
        await client.close()
