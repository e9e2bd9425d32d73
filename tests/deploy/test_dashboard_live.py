"""Every metric the Grafana dashboard queries is exposed by a running router or simulated worker."""

from __future__ import annotations

import urllib.request

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


def test_dashboard_metrics_exist_on_a_live_router_and_worker() -> None:
    sim_port, router_port = free_port(), free_port()
    sim = spawn(["-m", "engine_worker.sim", "--host", "127.0.0.1", "--port", str(sim_port),
                 "--model", "m", "--time-scale", "0.001"])
    router = spawn(["-m", "router", "serve", "--port", str(router_port), "--workers",
                    f"http://127.0.0.1:{sim_port}", "--admission", "true"])
    try:
        wait_http(f"http://127.0.0.1:{sim_port}/health", timeout=60, proc=sim)
        wait_http(f"http://127.0.0.1:{router_port}/ready", timeout=60, proc=router)
        body = b'{"model": "m", "max_tokens": 2, "prompt": "hello there"}'
        req = urllib.request.Request(f"http://127.0.0.1:{router_port}/v1/completions",
                                     data=body, headers={"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(req, timeout=30).close()
        except OSError as exc:  # say what the two processes were doing (a CI run hung here)
            stop(router)
            stop(sim)
            raise AssertionError(f"{exc!r}\nrouter:\n{router.stdout.read()}\n"  # type: ignore[union-attr]
                                 f"sim:\n{sim.stdout.read()}") from exc  # type: ignore[union-attr]
        live = exposed(f"http://127.0.0.1:{router_port}") | exposed(
            f"http://127.0.0.1:{sim_port}")
    finally:
        stop(router)
        stop(sim)
    wanted = metric_names(DASHBOARD)
    assert wanted, "the dashboard queries no metric"
    assert wanted <= live, f"dashboard metrics nobody exposes: {sorted(wanted - live)}"
