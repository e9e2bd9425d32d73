"""Every metric the Grafana dashboard queries is exposed by a running router or simulated worker."""

from __future__ import annotations

import urllib.request
import warnings
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.dashboard_metrics import metric_names
from tests.support import REPO, free_port, spawn, stop, wait_http

DASHBOARD = REPO / "deploy" / "grafana" / "prefix-router.json"
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
            "summary": ("_sum", "_count")}


def exposed(url: str) -> set[str]:
    """Series names a scrape can return, including families that have no sample yet."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(family.name + s for s in SUFFIXES.get(family.type, ()))
        names.update(sample.name for sample in family.samples)
    return names


def _logged(path: Path) -> str:
    return path.read_text(errors="replace")[-4000:] if path.exists() else ""


def test_dashboard_metrics_exist_on_a_live_router_and_worker(tmp_path: Path) -> None:
    sim_port, router_port = free_port(), free_port()
    sim_log, router_log = tmp_path / "sim.log", tmp_path / "router.log"
    sim = spawn(["-m", "engine_worker.sim", "--host", "127.0.0.1", "--port", str(sim_port),
                 "--model", "m", "--time-scale", "0.001"], log=sim_log)
    router = spawn(["-m", "router", "serve", "--port", str(router_port), "--workers",
                    f"http://127.0.0.1:{sim_port}", "--admission", "true"], log=router_log)
    try:
        wait_http(f"http://127.0.0.1:{sim_port}/health", timeout=60, proc=sim)
        wait_http(f"http://127.0.0.1:{router_port}/ready", timeout=60, proc=router)
        body = b'{"model": "m", "max_tokens": 2, "prompt": "hello there"}'
        req = urllib.request.Request(f"http://127.0.0.1:{router_port}/v1/completions",
                                     data=body, headers={"Content-Type": "application/json"})
        for attempt in (1, 2):
            try:
                urllib.request.urlopen(req, timeout=20).close()
                break
            except OSError as exc:  # a CI run saw one time out once: say what both logged
                logs = f"router:\n{_logged(router_log)}\nsim:\n{_logged(sim_log)}"
                if attempt == 2:
                    raise AssertionError(f"{exc!r}\n{logs}") from exc
                warnings.warn(f"request through the router failed, retried: {exc!r}\n{logs}",
                              stacklevel=1)
        live = exposed(f"http://127.0.0.1:{router_port}") | exposed(
            f"http://127.0.0.1:{sim_port}")
    finally:
        stop(router)
        stop(sim)
    wanted = metric_names(DASHBOARD)
    assert wanted, "the dashboard queries no metric"
    assert wanted <= live, f"dashboard metrics nobody exposes: {sorted(wanted - live)}"
