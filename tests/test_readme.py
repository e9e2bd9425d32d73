"""The README's promises, executed: the Quick start demo runs; the config table is whole."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from dataclasses import fields

from router.config import RouterConfig
from tests.support import REPO, free_port

README = (REPO / "README.md").read_text()


def test_quick_start_demo_serves_and_shows_routed_requests() -> None:
    commands = re.search(r"## Quick start.*?```bash\n(.*?)```", README, re.S)
    assert commands is not None
    demo = commands.group(1).splitlines()[0].split("#")[0].strip()
    assert demo == "make demo"
    env = {**os.environ, "PREFIX_ROUTER_PORT": str(free_port())}
    proc = subprocess.Popen(demo.split(), cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("Serving until Ctrl-C"):
                break
        routed = [line for line in lines if "-> worker" in line]
        assert len(routed) == 3, "".join(lines)
        # the second request for the same document found it warm on the same worker
        first, second = routed[0].split(), routed[1].split()
        assert first[3] == second[3] and "(warm):" in second
        cached = int(re.search(r"(\d+) cached", routed[1]).group(1))  # type: ignore[union-attr]
        assert cached > 0
        # and the engine's own TTFT says what the warm hit was worth
        ttft = [float(re.search(r"engine TTFT ([\d.]+) ms", r).group(1))  # type: ignore[union-attr]
                for r in routed]
        assert ttft[1] < ttft[0] and ttft[1] < ttft[2], routed
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=30)
    assert proc.returncode in (0, 2, -signal.SIGINT), "".join(lines)


def test_every_setting_is_documented_with_flag_and_env_var() -> None:
    for f in fields(RouterConfig):
        flag, env = f"--{f.name.replace('_', '-')}", f"PREFIX_ROUTER_{f.name.upper()}"
        assert f"| `{flag}` | `{env}` |" in README, f"{f.name} missing from README config table"
