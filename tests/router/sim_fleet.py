"""Simulated vLLM workers and a router, in this process over real HTTP on 127.0.0.1.

Cheaper than subprocesses for the API tests (issue 16): each SimServer is the simulator's
own aiohttp app on a real socket, the router is ``build_app`` on another.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
from aiohttp.test_utils import TestServer

from engine_worker.sim.clock import ScaledClock
from engine_worker.sim.engine import Engine
from engine_worker.sim.engine_config import EngineConfig
from engine_worker.sim.server import SimServer
from engine_worker.sim.tokenizer import SimTokenizer
from router.config import RouterConfig
from router.server.app import build_app
from router.server.state import ROUTER, RouterState

MODEL = "sim-a"


@dataclass
class SimFleet:
    sims: dict[str, SimServer]
    urls: dict[str, str]
    servers: dict[str, TestServer]
    router: TestServer
    extra_routers: list[TestServer] = field(default_factory=list)

    @property
    def url(self) -> str:
        return str(self.router.make_url("")).rstrip("/")

    def state(self, router: TestServer | None = None) -> RouterState:
        return (router or self.router).app[ROUTER]


def sim_server(time_scale: float = 0.001, max_model_len: int | None = None) -> SimServer:
    longest = {} if max_model_len is None else {"max_model_len": max_model_len}
    engine = Engine("llama-3-8b@h100-80gb",
                    EngineConfig(model_name=MODEL, hash_seed="0", **longest),
                    ScaledClock(time_scale))
    return SimServer(engine, SimTokenizer(engine.profile.model.vocab))


async def start_router(urls: dict[str, str], **config: object) -> TestServer:
    defaults: dict[str, object] = {"health_interval_s": 0.2, "scrape_interval_s": 0.0}
    cfg = RouterConfig(workers=tuple(urls.items()), **{**defaults, **config})
    server = TestServer(build_app(cfg), host="127.0.0.1")
    await server.start_server()
    return server


@contextlib.asynccontextmanager
async def sim_fleet(count: int, time_scale: float = 0.001, routers: int = 1,
                    max_model_len: int | None = None,
                    **config: object) -> AsyncIterator[SimFleet]:
    sims = {f"w{i}": sim_server(time_scale, max_model_len) for i in range(count)}
    servers = [TestServer(s.app(), host="127.0.0.1") for s in sims.values()]
    started: list[TestServer] = []
    try:
        for server in servers:
            await server.start_server()
            started.append(server)
        urls = {name: str(server.make_url("")).rstrip("/")
                for name, server in zip(sims, servers, strict=True)}
        for _ in range(routers):
            started.append(await start_router(urls, **config))
        fleet = SimFleet(sims, urls, dict(zip(sims, servers, strict=True)), started[count],
                         started[count + 1:])
        for router in [fleet.router, *fleet.extra_routers]:
            await fleet.state(router).health.check_all()  # type: ignore[union-attr]
        yield fleet
    finally:
        for server in reversed(started):
            await server.close()
        for sim in sims.values():
            await sim.engine.stop()


async def post(http: aiohttp.ClientSession, url: str, body: object
               ) -> tuple[int, dict, dict[str, str]]:
    async with http.post(url, json=body) as resp:
        return resp.status, await resp.json(content_type=None), dict(resp.headers)
