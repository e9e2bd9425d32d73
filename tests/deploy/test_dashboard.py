"""Every metric the Grafana dashboard queries is one the router or vLLM exposes."""

from __future__ import annotations

import json

import pytest

from tests.deploy import chart as c
from tests.deploy.dashboard_metrics import (
    ROUTER_METRICS,
    VLLM_METRICS,
    exposed_series,
    family_of,
    metric_names,
    promql_metric_names,
)

DASHBOARD = c.DEPLOY / "grafana" / "prefix-router.json"


def test_extraction_handles_promql_shapes():
    expr = ('histogram_quantile(0.95, sum by (le, worker) (rate('
            'prefix_router_request_latency_seconds_bucket{route=~"/v1/.*", le!="+Inf"}'
            '[$__rate_interval]))) / on (worker) group_left sum without (pod) '
            '(vllm:num_requests_running offset 5m) > bool 1e-3 and up')
    assert promql_metric_names(expr) == {
        "prefix_router_request_latency_seconds_bucket", "vllm:num_requests_running", "up"}
    assert promql_metric_names('sum(rate(x_total[5m:30s])) or vector(0)') == {"x_total"}


def test_metric_names_accepts_dict_text_and_path():
    as_dict = json.loads(DASHBOARD.read_text())
    assert metric_names(as_dict) == metric_names(DASHBOARD.read_text()) == metric_names(DASHBOARD)


def test_dashboard_uses_only_contract_metrics():
    used = metric_names(DASHBOARD)
    allowed = exposed_series(ROUTER_METRICS) | exposed_series(VLLM_METRICS)
    assert used, "no PromQL found"
    assert used <= allowed, f"unknown metrics: {sorted(used - allowed)}"


def test_dashboard_covers_what_the_issue_asks_for():
    families = {family_of(name) for name in metric_names(DASHBOARD)}
    for needed in ("prefix_router_routing_decisions_total", "vllm:prefix_cache_hits_total",
                   "vllm:prefix_cache_queries_total", "vllm:time_to_first_token_seconds",
                   "prefix_router_worker_in_flight", "prefix_router_redis_errors_total",
                   "prefix_router_worker_healthy", "prefix_router_admission_shed_total",
                   "prefix_router_admission_queue_depth"):
        assert needed in families


def test_dashboard_is_importable_grafana_json():
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 36
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}"


def test_chart_ships_the_same_dashboard():
    shipped = c.CHART / "files" / "grafana" / "prefix-router.json"
    assert shipped.read_bytes() == DASHBOARD.read_bytes(), (
        "cp deploy/grafana/prefix-router.json deploy/helm/prefix-router/files/grafana/")


def test_router_registry_exposes_the_contract_families():
    """The router's own registry defines every router family the dashboard may use."""
    metrics = pytest.importorskip("router.infra.metrics")
    admission = pytest.importorskip("router.admission.metrics")
    registry = metrics.RouterMetrics().registry
    admission.AdmissionMetrics(registry)  # the app adds these with --admission
    exposed = {}
    for family in registry.collect():
        name = family.name + "_total" if family.type == "counter" else family.name
        exposed[name] = family.type
    missing = {n: t for n, t in ROUTER_METRICS.items() if exposed.get(n) != t}
    assert not missing, f"router/infra/metrics.py lacks (or types differently): {missing}"
