"""Fixtures that run the router and its upstreams as real processes on 127.0.0.1."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support import REPO, free_port, spawn, stop, wait_http

MODEL = "test-model"


@dataclass
class Upstream:
    name: str
    port: int
    proc: subprocess.Popen

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stats(self) -> dict:
        with urllib.request.urlopen(self.url + "/stats", timeout=5) as resp:
            return json.load(resp)

    def post(self, path: str) -> None:
        req = urllib.request.Request(self.url + path, method="POST", data=b"")
        urllib.request.urlopen(req, timeout=5).close()


@dataclass
class Fleet:
    upstreams: list[Upstream]
    router_port: int
    router: subprocess.Popen
    extra: list[subprocess.Popen] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.router_port}"

    def by_name(self, name: str) -> Upstream:
        return next(u for u in self.upstreams if u.name == name)


def start_upstreams(count: int, model: str = MODEL) -> list[Upstream]:
    ups = []
    for i in range(count):
        port = free_port()
        proc = spawn(["-m", "tests.upstream_server", str(port), f"w{i}", model])
        ups.append(Upstream(f"w{i}", port, proc))
    for up in ups:
        wait_http(up.url + "/health", proc=up.proc)
    return ups


def start_router(worker_urls: list[str], *args: str,
                 env: dict[str, str] | None = None) -> tuple[int, subprocess.Popen]:
    port = free_port()
    proc = spawn(["-m", "router", "serve", "--port", str(port),
                  "--workers", ",".join(worker_urls), "--health-interval-s", "0.2", *args],
                 env=env)
    wait_http(f"http://127.0.0.1:{port}/ready", proc=proc)
    return port, proc


@pytest.fixture
def fleet(request: pytest.FixtureRequest) -> Iterator[Fleet]:
    """Three scripted upstreams behind one router; ``@pytest.mark.router_args(...)`` adds flags."""
    marker = request.node.get_closest_marker("router_args")
    args = list(marker.args) if marker else []
    ups = start_upstreams(3)
    port, proc = start_router([u.url for u in ups], *args)
    fleet = Fleet(ups, port, proc)
    yield fleet
    for p in [proc, *fleet.extra, *(u.proc for u in ups)]:
        stop(p)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny local tokenizer (scripts/make_tiny_model.py), for the precise-mode tests."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import make_tiny_model
    finally:
        sys.path.pop(0)
    out = tmp_path_factory.mktemp("tok")
    make_tiny_model.build_tokenizer(out, 1024, 0)
    return out
