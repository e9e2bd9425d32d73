"""Fixtures for SDK tests that need a real fleet: simulated vLLM workers and a router."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.support import free_port, spawn, stop, wait_http

SIM_MODEL = "sim-model"


@dataclass(frozen=True)
class Fleet:
    worker_urls: list[str]
    router_url: str = ""


def start_sims(count: int) -> tuple[list[str], list[subprocess.Popen]]:
    """Simulated workers at 1000x real time, so a request takes milliseconds."""
    urls: list[str] = []
    procs: list[subprocess.Popen] = []
    try:
        for _ in range(count):
            port = free_port()
            proc = spawn(["-m", "engine_worker.sim", "--host", "127.0.0.1", "--port", str(port),
                          "--model", SIM_MODEL, "--time-scale", "0.001"])
            procs.append(proc)
            urls.append(f"http://127.0.0.1:{port}")
        for url, proc in zip(urls, procs, strict=True):
            wait_http(url + "/health", timeout=60, proc=proc)
    except BaseException:
        for proc in procs:
            stop(proc)
        raise
    return urls, procs


@pytest.fixture(scope="session")
def sim_workers() -> Iterator[list[str]]:
    """Three simulated workers shared by the e2e and sidecar tests."""
    urls, procs = start_sims(3)
    yield urls
    for proc in procs:
        stop(proc)


@pytest.fixture(scope="session")
def fleet(sim_workers: list[str]) -> Iterator[Fleet]:
    """A router (flags only) in front of the simulated workers."""
    port = free_port()
    proc = spawn(["-m", "router", "serve", "--host", "127.0.0.1", "--port", str(port),
                  "--workers", ",".join(sim_workers)])
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/ready", timeout=60, proc=proc)
        yield Fleet(worker_urls=sim_workers, router_url=url)
    finally:
        stop(proc)
