"""The soak's one-minute version, as CI runs it: real router, workers, Redis and signals.

One round of every fault (a SIGKILL of the worker with the most open streams, a SIGSTOP,
a graceful restart, a SIGKILL of the Redis master, a Sentinel failover) under steady
mixed load; the acceptance of the
ten-minute run in bench/README.md, on a shorter clock.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support import REPO


def test_one_minute_soak_loses_nothing_and_resumes_every_killed_stream(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    proc = subprocess.run([sys.executable, "-m", "bench", "soak", "--minutes", "1",
                           "--fault-every-s", "10", "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert {"kill", "stop", "restart", "redis_kill", "failover_done"} <= set(result["faults"]), (
        result["faults"])
    assert result["requests"] > 100
    assert result["lost"] == 0, result["not_ok"]
    assert result["fates"]["4xx"] == 0
    assert result["killed_streams"] >= 1  # the kill picks the worker with open streams
    assert result["killed_streams_resumed"] == result["killed_streams"]
    assert result["rss_kb"]["growth"] < 0.10 and result["fds"]["growth"] < 0.10, (
        result["rss_kb"], result["fds"])
    assert proc.returncode == 0
