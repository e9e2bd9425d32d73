"""Redis Cluster and Sentinel topologies of real redis-server processes on loopback ports.

Kept fast: no persistence, small timeouts, readiness polled rather than slept for. Every
process is killed at the end; each topology lives in its own temporary directory.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from tests.support import free_port

SERVICE = "pr-master"


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: run .ci/run or `apt-get install redis-server`")
    return path


def _until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except redis.RedisError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout}s: {what}")


@dataclass
class Topology:
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="pr-redis-")))
    procs: list[subprocess.Popen] = field(default_factory=list)

    def server(self, port: int, *args: str) -> subprocess.Popen:
        proc = subprocess.Popen(
            [_binary("redis-server"), "--port", str(port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", str(self.workdir), *args],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.procs.append(proc)
        client = redis.Redis(host="127.0.0.1", port=port)
        _until(client.ping, 10, f"redis-server on {port}")
        return proc

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)


@dataclass
class Cluster(Topology):
    ports: list[int] = field(default_factory=list)

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports[:2])

    def client(self) -> redis.RedisCluster:
        return redis.RedisCluster(host="127.0.0.1", port=self.ports[0])

    def node(self, port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port)


def start_cluster(masters: int = 3) -> Cluster:
    """``masters`` cluster-enabled servers joined by ``redis-cli --cluster create``."""
    cluster = Cluster()
    for index in range(masters):
        port = free_port()
        cluster.ports.append(port)
        cluster.server(port, "--cluster-enabled", "yes", "--cluster-port", str(free_port()),
                       "--cluster-config-file", f"nodes-{index}.conf",
                       "--cluster-node-timeout", "2000")
    subprocess.run([_binary("redis-cli"), "--cluster", "create",
                    *(f"127.0.0.1:{p}" for p in cluster.ports), "--cluster-replicas", "0",
                    "--cluster-yes"], check=True, capture_output=True, timeout=30)
    for port in cluster.ports:
        node = cluster.node(port)
        _until(lambda n=node: b"cluster_state:ok" in n.execute_command("CLUSTER", "INFO"),
               15, f"cluster state ok on {port}")
    return cluster


@dataclass
class Sentinels(Topology):
    master_port: int = 0
    replica_port: int = 0
    sentinel_ports: list[int] = field(default_factory=list)

    @property
    def url(self) -> str:
        return ("redis+sentinel://" + ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
                + f"/{SERVICE}")

    def sentinel(self, index: int = 0) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.sentinel_ports[index],
                           decode_responses=True)

    def master_port_now(self) -> int:
        return int(self.sentinel().sentinel_get_master_addr_by_name(SERVICE)[1])

    def role(self, port: int) -> str:
        return redis.Redis(host="127.0.0.1", port=port).info("replication")["role"]

    def failover(self, timeout: float = 20.0) -> int:
        """SENTINEL FAILOVER, then wait until the replica is master and the old master its
        replica (until then the old one still takes writes, lost when it resyncs: Redis
        replication is asynchronous); the new master's port."""
        old = self.master_port_now()
        new = self.replica_port if old == self.master_port else self.master_port
        self.sentinel().execute_command("SENTINEL", "FAILOVER", SERVICE)
        _until(lambda: self.master_port_now() == new and self.role(new) == "master"
               and self.role(old) == "slave", timeout, "failover to the replica")
        return new


def start_sentinels(count: int = 3) -> Sentinels:
    """A master, one replica of it, and ``count`` sentinels (quorum 2) watching them."""
    topo = Sentinels(master_port=free_port(), replica_port=free_port())
    topo.server(topo.master_port)
    topo.server(topo.replica_port, "--replicaof", "127.0.0.1", str(topo.master_port))
    replica = redis.Redis(host="127.0.0.1", port=topo.replica_port)
    _until(lambda: replica.info("replication").get("master_link_status") == "up", 15,
           "replica in sync")
    for index in range(count):
        port = free_port()
        conf = topo.workdir / f"sentinel-{index}.conf"
        conf.write_text(f"port {port}\nbind 127.0.0.1\ndir {topo.workdir}\n"
                        f"sentinel monitor {SERVICE} 127.0.0.1 {topo.master_port} 2\n"
                        f"sentinel down-after-milliseconds {SERVICE} 1000\n"
                        f"sentinel failover-timeout {SERVICE} 5000\n")
        topo.sentinel_ports.append(port)
        proc = subprocess.Popen([_binary("redis-server"), str(conf), "--sentinel"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        topo.procs.append(proc)
        _until(topo.sentinel(index).ping, 10, f"sentinel on {port}")
    # each must know the replica (a failover needs one); they learn of each other within
    # ~2 s, but a forced SENTINEL FAILOVER asks no peer, so that is not waited for
    for index in range(count):
        s = topo.sentinel(index)
        _until(lambda s=s: len(s.sentinel_slaves(SERVICE)) == 1, 20,
               f"sentinel {index} knows the replica")
    return topo
