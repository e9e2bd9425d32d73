"""Each lmcache_config/ profile loads and validates with LMCache's own loader (engine venv)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.engine.envs import ENGINE_INSTALL, ENGINE_PYTHON, require
from tests.support import REPO

PROFILES = sorted((REPO / "lmcache_config").glob("*.yaml"))
CHECK = REPO / "scripts" / "check_lmcache_profile.py"
EXPECTED = {"cpu-offload", "disk", "remote-server", "redis-remote", "p2p"}


def run_check(*paths: Path) -> tuple[int, list[dict]]:
    python = require(ENGINE_PYTHON, ENGINE_INSTALL)
    # No LMCACHE_* from the caller's environment: they would override the files' keys.
    env = {k: v for k, v in os.environ.items() if not k.startswith("LMCACHE_")}
    proc = subprocess.run([str(python), str(CHECK), *map(str, paths)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(results) == len(paths), proc.stdout + proc.stderr
    return proc.returncode, results


def test_all_profiles_present() -> None:
    assert {p.stem for p in PROFILES} == EXPECTED


def test_each_profile_has_a_documented_header() -> None:
    for path in PROFILES:
        header = path.read_text().split("\n\n")[0]
        for needed in ("What it is for", "Memory it takes", "What must run beside it"):
            assert needed in header, f"{path.name}: header lacks {needed!r}"


def test_profiles_load_with_lmcache_loader() -> None:
    rc, results = run_check(*PROFILES)
    assert rc == 0, results
    by_name = {Path(r["file"]).stem: r for r in results}
    assert all(r["ok"] for r in results)
    assert by_name["cpu-offload"]["local_cpu"] is True
    assert by_name["disk"]["local_disk"] and by_name["disk"]["max_local_disk_size_gb"] > 0
    assert by_name["remote-server"]["remote_url"].startswith("lm://")
    assert by_name["redis-remote"]["remote_url"].startswith("redis://")
    assert by_name["p2p"]["enable_p2p"] and by_name["p2p"]["enable_controller"]
    for result in results:
        # LMCache chunks must start on vLLM block boundaries (block sizes 16 and 32).
        assert result["chunk_size"] % 32 == 0


@pytest.mark.parametrize(("body", "why"), [
    ("chunk_size: 256\nlocal_cpuu: true\n", "unknown key"),
    ("chunk_size: 256\nenable_p2p: true\n", "p2p without a controller"),
    ("chunk_size: 256\nremote_url: \"lm://no-port\"\n", "remote url without a port"),
])
def test_broken_profiles_fail(tmp_path: Path, body: str, why: str) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(body)
    rc, results = run_check(bad)
    assert rc == 1 and results[0]["ok"] is False, why
