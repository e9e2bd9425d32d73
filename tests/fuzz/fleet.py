"""The fleet the fuzzer drives: two simulated vLLM workers and two routers in front of them
(one as configured by default, one with --admission), each a real process on 127.0.0.1.

Output goes to files, not pipes: a process that logs a traceback per fuzz case would fill
a pipe nobody reads and stall, which the fuzzer would then report as the router hanging.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.fuzz.cases import TOKEN, WORKER_IDS
from tests.support import REPO, free_port, stop, wait_http

MODEL = "fuzz-model"
MAX_BODY_BYTES = 1024 * 1024
CLIENT_TIMEOUT_S = 2.0  # a body that never comes is answered 408 this late


@dataclass
class Process:
    name: str
    port: int
    proc: subprocess.Popen
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@dataclass
class FuzzFleet:
    workers: list[Process]
    routers: list[Process]
    logs: Path

    def stop(self) -> None:
        for process in [*self.routers, *self.workers]:
            stop(process.proc)


def _start(name: str, command: list[str], args: list[str], logs: Path) -> Process:
    port = free_port()
    log = logs / f"{name}.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, *command, "--port", str(port), *args],
                                cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return Process(name, port, proc, log)


def _wait(process: Process, path: str) -> None:
    try:
        wait_http(process.url + path, proc=process.proc)
    except (RuntimeError, TimeoutError) as exc:
        raise RuntimeError(f"{process.name}: {exc}\n{process.output()[-3000:]}") from None


def start_fleet() -> FuzzFleet:
    logs = Path(tempfile.mkdtemp(prefix="pr-fuzz-"))
    workers = [_start(wid, ["-m", "engine_worker.sim"], ["--model", MODEL, "--time-scale",
                                                          "0.001", "--log-level", "WARNING"],
                      logs) for wid in WORKER_IDS]
    fleet = FuzzFleet(workers, [], logs)
    try:
        for worker in workers:
            _wait(worker, "/health")
        spec = ",".join(f"{w.name}={w.url}" for w in workers)
        common = ["--workers", spec, "--max-body-bytes", str(MAX_BODY_BYTES),
                  "--client-timeout-s", str(CLIENT_TIMEOUT_S), "--admin-token", TOKEN,
                  "--health-interval-s", "0.5", "--health-timeout-s", "10",
                  "--log-level", "warning"]
        serve = ["-m", "router", "serve"]
        fleet.routers = [_start("router", serve, common, logs),
                         _start("router-admission", serve, [*common, "--admission", "true"],
                                logs)]
        for router in fleet.routers:
            _wait(router, "/ready")
    except BaseException:
        fleet.stop()
        raise
    return fleet
