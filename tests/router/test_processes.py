"""``--processes 2``: two router processes on one port, each with its own picture."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request

from tests.support import free_port, spawn, stop, wait_http

BODY = b'{"model":"m","prompt":"hello there","max_tokens":4}'


def routers(pid: int) -> list[int]:
    """The parent's router children (not multiprocessing's resource tracker)."""
    with open(f"/proc/{pid}/task/{pid}/children") as fh:
        kids = [int(c) for c in fh.read().split()]
    return [k for k in kids if b"spawn_main" in open(f"/proc/{k}/cmdline", "rb").read()]


def listening(pid: int, port: int) -> bool:
    """Does the process hold a socket listening on ``port`` (from /proc/net/tcp)?"""
    with open("/proc/net/tcp") as fh:
        inodes = {f.split()[9] for f in fh.readlines()[1:]
                  if f.split()[1].endswith(f":{port:04X}") and f.split()[3] == "0A"}
    fds = f"/proc/{pid}/fd"
    sockets = {f"socket:[{i}]" for i in inodes}

    def target(fd: str) -> str:
        try:
            return os.readlink(f"{fds}/{fd}")
        except FileNotFoundError:  # closed between the listing and the read
            return ""

    return any(target(fd) in sockets for fd in os.listdir(fds))


def served(url: str) -> int:
    """Answered completions in the /metrics of whichever process this connection reached."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return int(sum(float(v) for v in re.findall(
        r'^prefix_router_requests_total\{[^}]*route="/v1/completions"[^}]*\} (\S+)$', text,
        re.M)))


def until(check, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def all_ready(url: str) -> bool:
    try:
        return all(urllib.request.urlopen(url + "/ready", timeout=5).status == 200
                   for _ in range(20))  # fresh connections: both processes answer
    except urllib.error.URLError:
        return False


def test_two_processes_share_the_port_and_stop_together() -> None:
    up_port, port = free_port(), free_port()
    upstream = spawn(["-m", "tests.upstream_server", str(up_port), "w0", "m"])
    router: subprocess.Popen | None = None
    try:
        wait_http(f"http://127.0.0.1:{up_port}/health", proc=upstream)
        router = spawn(["-m", "router", "serve", "--port", str(port), "--processes", "2",
                        "--workers", f"http://127.0.0.1:{up_port}", "--policy", "round_robin",
                        "--health-interval-s", "0.2", "--log-level", "warning"])
        url = f"http://127.0.0.1:{port}"
        pid = router.pid
        until(lambda: len(routers(pid)) == 2 and all(listening(c, port) for c in routers(pid)))
        until(lambda: all_ready(url))
        for _ in range(31):  # a fresh connection each: the kernel spreads them by hash
            request = urllib.request.Request(url + "/v1/completions", data=BODY,
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=10) as resp:
                assert resp.status == 200
        # without Redis each process counts only what it served: two views summing to 31
        # (an odd total, so the two counts always differ and the set keeps both)
        views = {served(url) for _ in range(40)}
        assert len(views) == 2 and sum(views) == 31, views
        # a child that dies takes the other down: the parent exits 1, leaving none behind
        children = routers(pid)
        os.kill(children[0], signal.SIGKILL)
        assert router.wait(timeout=40) == 1
        assert not any(os.path.exists(f"/proc/{c}") for c in children)
    finally:
        if router is not None:
            stop(router)
        stop(upstream)
