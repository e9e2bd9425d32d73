"""Faults injected on a schedule into a running fleet: real signals to real processes.

One fault at a time, rotating over the workers, each round the same five: the worker
with the most open streams SIGKILLed (restarted on its port a few seconds later, cold), a
worker SIGSTOPped then SIGCONTed, a worker restarted gracefully (SIGTERM: it drains,
exits, comes back), the Redis master SIGKILLed (the sentinels fail over; it comes back as
a replica), and a planned ``SENTINEL FAILOVER``. Every injection is logged with its wall
time, so a request's fate can be matched to what happened to its worker while it ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis

from bench.fleet import Proc, free_port, ready, spawn

FAULTS = ("kill", "stop", "restart", "redis", "failover")
SERVICE = "soak-master"


@dataclass(frozen=True, slots=True)
class Injected:
    at: float  # time.monotonic()
    fault: str  # kill, stop, cont, restart, up, redis_kill, redis_up
    target: str


@dataclass
class SentinelRedis:
    """Redis as a fleet runs it: a master, a replica and three sentinels (quorum 2), each a
    real redis-server on a free port; the router reaches it as ``redis+sentinel://``."""

    workdir: Path
    ports: list[int] = field(default_factory=lambda: [free_port(), free_port()])
    sentinel_ports: list[int] = field(default_factory=lambda: [free_port() for _ in range(3)])
    procs: dict[int, subprocess.Popen] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return ("redis+sentinel://" + ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
                + f"/{SERVICE}")

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        master, replica = self.ports
        self._server(master)
        self._server(replica, "--replicaof", "127.0.0.1", str(master))
        _until(lambda: _info(replica).get("master_link_status") == "up", "replica in sync")
        for index, port in enumerate(self.sentinel_ports):
            conf = self.workdir / f"sentinel-{index}.conf"
            conf.write_text(f"port {port}\nbind 127.0.0.1\ndir {self.workdir}\n"
                            f"sentinel monitor {SERVICE} 127.0.0.1 {master} 2\n"
                            f"sentinel down-after-milliseconds {SERVICE} 1000\n"
                            f"sentinel failover-timeout {SERVICE} 5000\n")
            self.procs[port] = _popen([_redis_server(), str(conf), "--sentinel"])
        for port in self.sentinel_ports:
            _until(lambda p=port: len(_sentinel(p).sentinel_slaves(SERVICE)) == 1,
                   "sentinels know the replica")

    def master(self) -> int:
        return int(_sentinel(self.sentinel_ports[0]).sentinel_get_master_addr_by_name(
            SERVICE)[1])

    def kill_master(self) -> int:
        port = self.master()
        self.procs[port].kill()
        self.procs[port].wait()
        return port

    def revive(self, port: int) -> None:
        """Back on its port; the sentinels make it a replica of whoever is master now."""
        self._server(port)

    def failover(self) -> None:
        """SENTINEL FAILOVER, and wait until the replica is the master."""
        old = self.master()
        _sentinel(self.sentinel_ports[0]).execute_command("SENTINEL", "FAILOVER", SERVICE)
        _until(lambda: self.master() != old and _info(self.master())["role"] == "master",
               "failover to the replica")

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def _server(self, port: int, *args: str) -> None:
        self.procs[port] = _popen([_redis_server(), "--port", str(port), "--bind", "127.0.0.1",
                                   "--save", "", "--appendonly", "no", "--dir",
                                   str(self.workdir), *args])
        _until(lambda: redis.Redis(host="127.0.0.1", port=port).ping(), f"redis on {port}")


def _redis_server() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("the soak needs redis-server on PATH")
    return binary


def _popen(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def _info(port: int) -> dict:
    return redis.Redis(host="127.0.0.1", port=port).info("replication")


def _sentinel(port: int) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port, decode_responses=True)


def _until(predicate: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(redis.RedisError):
            if predicate():
                return
        time.sleep(0.05)
    raise RuntimeError(f"not within {timeout} s: {what}")


def restart(proc: Proc, logdir: Path) -> Proc:
    """The same command on the same port: a new engine with a cold cache."""
    again = spawn(proc.name, proc.popen.args, proc.url, logdir)
    return ready(again)


class Injector:
    """Runs the schedule: ``fault_every_s`` apart, starting at ``start_s``, until ``end_s``."""

    def __init__(self, workers: list[Proc], store: SentinelRedis, logdir: Path, *,
                 start_s: float, end_s: float, fault_every_s: float, hang_s: float,
                 down_s: float, busiest: Callable[[], int | None] = lambda: None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.workers = workers
        self.store = store
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
        """SIGKILL of the Redis master: the sentinels promote the replica; the old master
        comes back as its replica."""
        port = await asyncio.to_thread(self.store.kill_master)
        self._note("redis_kill", f"redis:{port}")
        await asyncio.sleep(self.down_s)
        await asyncio.to_thread(self.store.revive, port)
        self._note("redis_up", f"redis:{port}")

    async def _failover(self, _: int) -> None:
        self._note("failover", "redis")
        await asyncio.to_thread(self.store.failover)
        self._note("failover_done", f"redis:{self.store.master()}")

    def resume_all(self) -> None:
        """Leave no worker stopped (a run cut short mid-hang)."""
        for worker in self.workers:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.popen.pid, signal.SIGCONT)
