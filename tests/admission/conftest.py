"""Simulated vLLM workers as real processes, slow enough (an L4's prefill) that a few
prompts fill them, before a router app in this loop with admission on."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient

from tests.support import free_port, spawn, stop, wait_http
from tests.unit.fakes import router_client

MODEL = "sim-model"
PROFILE = "llama-3-8b@l4"  # ~3,600 prefill tokens/s (simulated)
TIME_SCALE = 2.0  # real seconds per simulated second: ~1,800 tokens/s of wall clock
RATE = 3600.0 / TIME_SCALE


class Sim:
    def __init__(self, name: str, seed: int) -> None:
        self.name = name
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.proc = spawn(["-m", "engine_worker.sim", "--port", str(port), "--model", MODEL,
                           "--profile", PROFILE, "--time-scale", str(TIME_SCALE),
                           "--seed", str(seed), "--max-model-len", "32768",
                           "--log-level", "WARNING"])

    def ready(self) -> Sim:
        wait_http(self.url + "/health", proc=self.proc)
        return self


@pytest.fixture
def sims() -> Iterator[Callable[[int], list[Sim]]]:
    started: list[Sim] = []

    def start(count: int) -> list[Sim]:
        fresh = [Sim(f"w{i}", i) for i in range(count)]
        started.extend(fresh)
        return [s.ready() for s in fresh]

    yield start
    for sim in started:
        stop(sim.proc)


def text(name: str, tokens: int) -> str:
    """About ``tokens`` simulated tokens (one short word each)."""
    return " ".join(f"{name}{i % 100}" for i in range(tokens))


def body(prompt: str, *, stream: bool = False, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt, "max_tokens": 2, "stream": stream, **extra}


@contextlib.asynccontextmanager
async def admitting(workers: list[Sim], **overrides: Any) -> AsyncIterator[TestClient]:
    settings: dict[str, Any] = {"admission": True, "prefill_rate": RATE,
                                "engine_queue_s": 0.2, "max_queue_wait_s": 30.0,
                                "scrape_interval_s": 0.0}
    settings.update(overrides)
    async with router_client(workers, **settings) as client:
        yield client


async def queued(client: TestClient) -> float:
    """Requests waiting in the router's queue, from its /metrics."""
    async with client.get("/metrics") as resp:
        text_ = await resp.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text_.splitlines()
               if line.startswith("prefix_router_admission_queue_depth{"))


async def until(predicate: Callable[[], Awaitable[bool]], what: str,
                timeout_s: float = 20.0) -> None:
    """Poll ``predicate`` (a bound on waiting, not on how fast anything is)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def sim_metric(sim: Sim, name: str) -> float:
    """Sum of one vllm:* sample over its labels, read off the engine's /metrics."""
    async with aiohttp.ClientSession() as s, s.get(sim.url + "/metrics") as resp:
        text_ = await resp.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text_.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))
