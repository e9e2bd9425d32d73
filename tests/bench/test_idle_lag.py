"""bench.idle_lag: one real simulated worker, every prompt of every mode found in its log."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys

from bench.fleet import free_port, wait_http
from bench.idle_lag import MODES, measure


def test_measures_each_length_in_each_mode_from_the_workers_own_log() -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "engine_worker.sim", "--port", str(port),
                             "--model", "sim", "--log-level", "ERROR"])
    try:
        wait_http(url + "/health", proc)
        rows = asyncio.run(measure(url, [300, 900], count=2))
    finally:
        proc.terminate()
        proc.wait()
    assert [n for n, _ in rows] == [300, 900]
    for _, lags in rows:
        assert len(lags) == len(MODES) and all(math.isfinite(lag) for lag in lags)
