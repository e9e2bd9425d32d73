"""Shared fixtures: a private redis-server per test session (never the system one on 6379)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import redis

from tests.support import free_port


@dataclass
class RedisServer:
    port: int
    proc: subprocess.Popen
    workdir: str

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port)

    def start(self) -> None:
        """(Re)start the server on the same port, as an operator restarting Redis would."""
        self.proc = _launch_redis(self.port, self.workdir)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def _launch_redis(port: int, workdir: str) -> subprocess.Popen:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed: run .ci/run or `apt-get install redis-server`")
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", workdir],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(host="127.0.0.1", port=port)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            client.ping()
            return proc
        except redis.ConnectionError:
            time.sleep(0.02)
    proc.kill()
    pytest.fail(f"redis-server did not start on port {port}")


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A fresh, empty redis-server on a free port, stopped after the test."""
    workdir = tempfile.mkdtemp(prefix="pr-redis-")
    port = free_port()
    server = RedisServer(port=port, proc=_launch_redis(port, workdir), workdir=workdir)
    yield server
    if server.proc.poll() is None:
        server.proc.terminate()
        server.proc.wait(timeout=10)
    shutil.rmtree(workdir, ignore_errors=True)
