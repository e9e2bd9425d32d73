"""Start and stop the system under test: N simulated workers and a router, as subprocesses.

Processes run in their own session so a stop never touches anything else; each one's
output goes to a log file under the run directory for diagnosis.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from router.routing.feedback import BYTES_PER_TOKEN

REPO = Path(__file__).resolve().parent.parent
MODEL = "bench-model"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen | None = None, timeout: float = 60.0) -> None:
    """Poll until url answers 2xx; fail early with the log's tail if the process died."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode} before {url} was up")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if 200 <= resp.status < 300:
                    return
        except Exception as exc:  # noqa: BLE001 - any failure means "not yet"
            last = exc
        time.sleep(0.1)
    raise TimeoutError(f"{url} not up after {timeout}s: {last}")


@dataclass
class Proc:
    name: str
    url: str
    popen: subprocess.Popen
    log: Path

    def stop(self, timeout: float = 10.0) -> None:
        if self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait()


def spawn(name: str, argv: Sequence[str], url: str, logdir: Path,
          env: dict[str, str] | None = None, cpus: set[int] | None = None) -> Proc:
    """Start a process in its own session with its output in logdir/name.log."""
    logdir.mkdir(parents=True, exist_ok=True)
    log = logdir / f"{name}.log"
    fh = open(log, "w")  # noqa: SIM115 - owned by the child; closed with the process
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONHASHSEED": "0", **(env or {})}

    def pin() -> None:
        if cpus:
            os.sched_setaffinity(0, cpus)

    popen = subprocess.Popen(list(argv), cwd=REPO, env=full_env, stdout=fh,
                             stderr=subprocess.STDOUT, start_new_session=True,
                             preexec_fn=pin if cpus else None)
    return Proc(name, url, popen, log)


def ready(proc: Proc, ready_path: str = "/health", timeout: float = 60.0) -> Proc:
    try:
        wait_http(proc.url + ready_path, proc.popen, timeout)
    except Exception as exc:
        proc.stop()
        raise RuntimeError(f"{proc.name} did not start ({exc}); log {proc.log}:\n"
                           f"{proc.log.read_text()[-2000:]}") from exc
    return proc


def launch(name: str, argv: Sequence[str], url: str, logdir: Path,
           env: dict[str, str] | None = None, ready_path: str = "/health",
           cpus: set[int] | None = None, timeout: float = 60.0) -> Proc:
    return ready(spawn(name, argv, url, logdir, env, cpus), ready_path, timeout)


@dataclass
class WorkerSpec:
    profile: str = "llama-3-8b@h100-80gb"
    time_scale: float = 1.0
    num_gpu_blocks: int | None = None
    max_model_len: int | None = None
    max_num_seqs: int = 256
    extra: list[str] = field(default_factory=list)


def start_workers(n: int, spec: WorkerSpec, logdir: Path,
                  cpus: set[int] | None = None) -> list[Proc]:
    procs: list[Proc] = []
    try:
        for i in range(n):
            port = free_port()
            argv = [sys.executable, "-m", "engine_worker.sim", "--host", "127.0.0.1",
                    "--port", str(port), "--model", MODEL, "--profile", spec.profile,
                    "--time-scale", str(spec.time_scale), "--seed", str(i),
                    "--max-num-seqs", str(spec.max_num_seqs), "--log-level", "WARNING"]
            if spec.num_gpu_blocks:
                argv += ["--num-gpu-blocks", str(spec.num_gpu_blocks)]
            if spec.max_model_len:
                argv += ["--max-model-len", str(spec.max_model_len)]
            procs.append(spawn(f"worker{i}", argv + spec.extra, f"http://127.0.0.1:{port}",
                               logdir, cpus=cpus))
        for p in procs:  # started together, waited for together: startup is not serial
            ready(p)
    except Exception:
        for p in procs:
            p.stop()
        raise
    return procs


def residency_capacity(num_gpu_blocks: int, block_chars: int, block_size: int = 16) -> int:
    """KV capacity in router chain blocks before any answer: the router corrects it from
    the engines' scraped capacity and the bytes per token it learns (RouterState)."""
    return max(1, math.floor(num_gpu_blocks * block_size * BYTES_PER_TOKEN / block_chars))


def start_router(worker_urls: Sequence[str], policy: str, logdir: Path, *,
                 epsilon: float = 0.25, residency_blocks: int | None = None,
                 redis_url: str | None = None, extra: Sequence[str] = (),
                 cpus: set[int] | None = None, name: str = "router") -> Proc:
    port = free_port()
    argv = [sys.executable, "-m", "router", "serve", "--host", "127.0.0.1", "--port", str(port),
            "--workers", ",".join(worker_urls), "--policy", policy,
            "--bound-epsilon", str(epsilon), "--log-level", "warning"]
    if residency_blocks:
        argv += ["--residency-capacity", str(residency_blocks)]
    if redis_url:
        argv += ["--redis-url", redis_url]
    return launch(name, argv + list(extra), f"http://127.0.0.1:{port}", logdir,
                  ready_path="/ready", cpus=cpus)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process from /proc/<pid>/stat, in seconds."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of a process and all its descendants (``--processes N`` children)."""
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            total += cpu_seconds(p)
            with open(f"/proc/{p}/task/{p}/children") as fh:
                todo += [int(c) for c in fh.read().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total
