"""Helpers for tests that run real processes: free ports, readiness waits, clean shutdown."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_http(url: str, timeout: float = 30.0, proc: subprocess.Popen | None = None) -> None:
    """Poll until url answers 2xx; fail early if the process died."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            raise RuntimeError(f"process exited with {proc.returncode} before {url} was up:\n{out}")
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if 200 <= resp.status < 300:
                    return
        except Exception as exc:  # noqa: BLE001 - any failure means "not yet"
            last = exc
        time.sleep(0.05)
    raise TimeoutError(f"{url} not up after {timeout}s: {last}")


def spawn(args: Sequence[str], env: dict[str, str] | None = None,
          log: Path | None = None) -> subprocess.Popen:
    """Start a Python module as a child process with its output captured for diagnostics:
    in a pipe, read once it exits, or in ``log``, readable while it runs."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with contextlib.ExitStack() as files:
        out = files.enter_context(log.open("w")) if log is not None else subprocess.PIPE
        return subprocess.Popen(
            [sys.executable, *args],
            cwd=REPO,
            env=full_env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
