"""Faults injected on a schedule into a running fleet: real signals to real processes.

One fault at a time, rotating over the workers, each round the same four: the worker
with the most open streams SIGKILLed (restarted on its port a few seconds later, cold), a
worker SIGSTOPped then
SIGCONTed, a worker restarted gracefully (SIGTERM: it drains, exits, comes back), Redis
SIGKILLed and restarted. Every injection is logged with its wall time, so a request's fate
can be matched to what happened to its worker while it ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.fleet import Proc, free_port, ready, spawn

FAULTS = ("kill", "stop", "restart", "redis")


@dataclass(frozen=True, slots=True)
class Injected:
    at: float  # time.monotonic()
    fault: str  # kill, stop, cont, restart, up, redis_kill, redis_up
    target: str


@dataclass
class RedisProc:
    """A private redis-server on a free port that can be killed and restarted in place."""

    workdir: Path
    port: int = field(default_factory=free_port)
    popen: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit("the soak needs redis-server on PATH")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.popen = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(
                    ("127.0.0.1", self.port), timeout=0.2):
                return
            time.sleep(0.02)
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def kill(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()

    def stop(self) -> None:
        self.kill()


def restart(proc: Proc, logdir: Path) -> Proc:
    """The same command on the same port: a new engine with a cold cache."""
    again = spawn(proc.name, proc.popen.args, proc.url, logdir)
    return ready(again)


class Injector:
    """Runs the schedule: ``fault_every_s`` apart, starting at ``start_s``, until ``end_s``."""

    def __init__(self, workers: list[Proc], redis: RedisProc, logdir: Path, *,
                 start_s: float, end_s: float, fault_every_s: float, hang_s: float,
                 down_s: float, busiest: Callable[[], int | None] = lambda: None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.workers = workers
        self.redis = redis
        self.logdir = logdir
        self.start_s = start_s
        self.end_s = end_s
        self.every_s = fault_every_s
        self.hang_s = hang_s
        self.down_s = down_s
        self.log: list[Injected] = []
        self._busiest = busiest  # the worker with the most open streams, for SIGKILL
        self._clock = clock

    def _note(self, fault: str, target: str) -> None:
        self.log.append(Injected(self._clock(), fault, target))

    async def run(self, t0: float) -> None:
        step = 0
        while True:
            at = t0 + self.start_s + step * self.every_s
            fault = FAULTS[step % len(FAULTS)]
            busy = self.down_s if fault != "stop" else self.hang_s
            if at + busy + 2 > t0 + self.end_s:
                return
            await asyncio.sleep(max(0.0, at - self._clock()))
            index = (step // len(FAULTS) + step) % len(self.workers)
            if fault == "kill" and (busiest := self._busiest()) is not None:
                index = busiest
            await getattr(self, "_" + fault)(index)
            step += 1

    async def _kill(self, index: int) -> None:
        worker = self.workers[index]
        os.killpg(worker.popen.pid, signal.SIGKILL)
        worker.popen.wait()
        self._note("kill", worker.name)
        await asyncio.sleep(self.down_s)
        self.workers[index] = await asyncio.to_thread(restart, worker, self.logdir)
        self._note("up", worker.name)

    async def _stop(self, index: int) -> None:
        worker = self.workers[index]
        os.killpg(worker.popen.pid, signal.SIGSTOP)
        self._note("stop", worker.name)
        await asyncio.sleep(self.hang_s)
        os.killpg(worker.popen.pid, signal.SIGCONT)
        self._note("cont", worker.name)

    async def _restart(self, index: int) -> None:
        worker = self.workers[index]
        self._note("restart", worker.name)
        await asyncio.to_thread(worker.stop, 60.0)  # SIGTERM: drains its requests first
        self.workers[index] = await asyncio.to_thread(restart, worker, self.logdir)
        self._note("up", worker.name)

    async def _redis(self, _: int) -> None:
        self.redis.kill()
        self._note("redis_kill", "redis")
        await asyncio.sleep(self.down_s)
        await asyncio.to_thread(self.redis.start)
        self._note("redis_up", "redis")

    def resume_all(self) -> None:
        """Leave no worker stopped (a run cut short mid-hang)."""
        for worker in self.workers:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.popen.pid, signal.SIGCONT)
