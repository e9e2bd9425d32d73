"""Metric names used by a Grafana dashboard's PromQL, and the names the fleet exposes.

``metric_names(dashboard)`` returns the series names exactly as the queries use them
(``foo_bucket`` for a histogram quantile), which is also how they appear in a live
``/metrics`` exposition, so the same set can be checked against a running router and
simulated worker as well as against the contract lists below.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

# The contract (issue 8): family name -> type. Counters are listed with their _total.
ROUTER_METRICS: dict[str, str] = {
    "prefix_router_requests_total": "counter",
    "prefix_router_routing_decisions_total": "counter",
    "prefix_router_request_latency_seconds": "histogram",
    "prefix_router_time_to_first_byte_seconds": "histogram",
    "prefix_router_worker_in_flight": "gauge",
    "prefix_router_worker_healthy": "gauge",
    "prefix_router_residency_lookups_total": "counter",
    "prefix_router_redis_errors_total": "counter",
    "prefix_router_redis_latency_seconds": "histogram",
    # overload (issue 12): router/admission/metrics.py
    "prefix_router_admission_queue_depth": "gauge",
    "prefix_router_admission_queue_wait_seconds": "histogram",
    "prefix_router_admission_admitted_total": "counter",
    "prefix_router_admission_shed_total": "counter",
    "prefix_router_admission_abandoned_total": "counter",
    "prefix_router_tenant_uncached_tokens_total": "counter",
    "prefix_router_tenant_limits_shared": "gauge",
}
VLLM_METRICS: dict[str, str] = {
    "vllm:prefix_cache_queries_total": "counter",
    "vllm:prefix_cache_hits_total": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
}

_HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")

# PromQL words that look like identifiers but are not metric names.
_KEYWORDS = frozenset({
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
    "and", "or", "unless", "inf", "nan", "atan2",
})
_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+")
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_NUMBER = re.compile(r"(?<![\w:])(?:0x[0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?"
                     r"(?:ms|s|m|h|d|w|y)?)(?![\w:])")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def expressions(dashboard: dict[str, Any]) -> Iterator[str]:
    """Every PromQL ``expr`` in the dashboard's panels (rows' nested panels included)."""
    def walk(panels: Iterable[dict[str, Any]]) -> Iterator[str]:
        for panel in panels:
            for target in panel.get("targets", []):
                if target.get("expr"):
                    yield target["expr"]
            yield from walk(panel.get("panels", []))
    yield from walk(dashboard.get("panels", []))


def promql_metric_names(expr: str) -> set[str]:
    """Metric names referenced by one PromQL expression."""
    text = _STRING.sub(" ", expr)          # label values, regexes
    text = _VARIABLE.sub(" ", text)        # Grafana variables ($__rate_interval, ${x})
    for pattern in (_MATCHERS, _RANGE, _GROUPING):
        text = pattern.sub(" ", text)      # {label matchers}, [5m:1m], by (labels)
    text = _NUMBER.sub(" ", text)
    names = set()
    for match in _IDENT.finditer(text):
        word = match.group()
        rest = text[match.end():].lstrip()
        if rest.startswith("("):            # function or aggregation: rate(, sum (
            continue
        if word.lower() in _KEYWORDS:
            continue
        names.add(word)
    return names


def metric_names(dashboard_json: dict[str, Any] | str | Path) -> set[str]:
    """Every metric name the dashboard's PromQL expressions use.

    Accepts the parsed dashboard, its JSON text, or a path to the JSON file.
    """
    if isinstance(dashboard_json, Path):
        dashboard_json = dashboard_json.read_text()
    dashboard = json.loads(dashboard_json) if isinstance(dashboard_json, str) else dashboard_json
    names: set[str] = set()
    for expr in expressions(dashboard):
        names |= promql_metric_names(expr)
    return names


def exposed_series(families: dict[str, str]) -> set[str]:
    """Series names a /metrics page shows for these families (histograms expand)."""
    out: set[str] = set()
    for name, kind in families.items():
        if kind == "histogram":
            out.update(name + suffix for suffix in _HISTOGRAM_SUFFIXES)
        else:
            out.add(name)
    return out


def family_of(series: str) -> str:
    """The family a series belongs to (strips a histogram's _bucket/_sum/_count)."""
    for suffix in _HISTOGRAM_SUFFIXES:
        if series.endswith(suffix):
            return series[: -len(suffix)]
    return series
