"""Turn a run's raw records and the workers' metric deltas into the result JSON.

Client-side times are wall seconds divided by the time scale (simulated seconds, which
include the router hop and this machine's CPU contention); the workers' histograms are
the engine's own simulated latencies, and a simulator's request log gives each request's
engine TTFT exactly, and its server's, so a client's TTFT splits into the engine's, the
engine server's own time beyond it and the hops outside the engine. All are reported;
the hit rate comes only from the workers' counters.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from bench import scrape
from bench.loadgen import Record

TTFT = "vllm:time_to_first_token_seconds"
E2E = "vllm:e2e_request_latency_seconds"


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0 to 1) the way every table here reports it (numpy's linear
    interpolation), NaN for none: one convention, so the offline, wait and overload tables
    read alike."""
    return float(np.percentile(np.asarray(values, dtype=float), 100 * q)) if len(values) \
        else math.nan


def pct(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p90": None, "p99": None, "mean": None, "max": None}
    arr = np.asarray(values, dtype=float)
    p50, p90, p99 = np.percentile(arr, [50, 90, 99])
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99),
            "mean": float(arr.mean()), "max": float(arr.max())}


def busy_seconds(intervals: Sequence[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals: time a worker had work in flight."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def _ratio_max_mean(values: Sequence[float]) -> float | None:
    mean = sum(values) / len(values) if values else 0.0
    return max(values) / mean if mean else None


def summarize(records: Sequence[Record], *, time_scale: float, wall_s: float,
              worker_urls: Sequence[str], worker_ids: Sequence[str] | None,
              deltas: Sequence[Mapping[str, float]], router_cpu_s: float | None,
              bounds: Mapping[str, Any] | None, meta: Mapping[str, Any],
              engine_ttfts: Mapping[str, tuple[float, float | None]] | None = None
              ) -> dict[str, Any]:
    ok = [r for r in records if r.status == "ok"]
    sim = 1000.0 / time_scale  # wall seconds -> simulated milliseconds
    ttft = [(r.first_token_s - r.sent_s) * sim for r in ok if r.first_token_s is not None]
    engine = _join_engine_ttfts(ok, engine_ttfts or {})
    served = [r for r in engine if r.server_ttft_ms is not None]
    hop = [(r.first_token_s - r.sent_s) * sim - r.server_ttft_ms for r in served]
    lag = [r.server_ttft_ms - r.engine_ttft_ms for r in served]
    e2e = [(r.end_s - r.sent_s) * sim for r in ok]
    fleet = scrape.add(deltas)
    queries = fleet.get("vllm:prefix_cache_queries_total", 0.0)
    hits = fleet.get("vllm:prefix_cache_hits_total", 0.0)

    by_header: dict[str, list[Record]] = {}
    for r in records:
        if r.worker is not None:
            by_header.setdefault(r.worker, []).append(r)
    workers = []
    for i, (url, d) in enumerate(zip(worker_urls, deltas, strict=True)):
        wid = worker_ids[i] if worker_ids else None
        routed = by_header.get(wid, []) if wid else []
        intervals = [(r.sent_s, r.end_s) for r in routed if r.sent_s is not None and r.end_s]
        q = d.get("vllm:prefix_cache_queries_total", 0.0)
        h = d.get("vllm:prefix_cache_hits_total", 0.0)
        workers.append({
            "url": url, "id": wid,
            "requests": int(d.get("vllm:request_success_total", 0.0)),
            "routed_by_header": len(routed) if wid else None,
            "busy_s": busy_seconds(intervals) / time_scale if wid else None,
            "prefix_cache_queries": q, "prefix_cache_hits": h,
            "hit_rate": h / q if q else None,
            "preemptions": d.get("vllm:num_preemptions_total", 0.0)})
    reqs = [w["requests"] for w in workers]
    busy = [w["busy_s"] for w in workers if w["busy_s"] is not None]
    sim_duration = wall_s / time_scale
    counts = {s: sum(r.status == s for r in records)
              for s in ("ok", "error", "timeout", "not_sent")}
    return {
        "meta": dict(meta),
        "requests": {"total": len(records), **counts},
        "duration_s": {"wall": wall_s, "simulated": sim_duration},
        "ttft_ms": pct(ttft), "e2e_ms": pct(e2e),
        "worker_ttft_ms": histogram_ms(fleet, TTFT), "worker_e2e_ms": histogram_ms(fleet, E2E),
        # per request, exact: the engine's own TTFT; its server's time beyond it (parsing,
        # tokenizing, its event loop's lag behind the model on a shared CPU); and what
        # the client waited beyond the engine server (load generator -> router ->
        # engine and back)
        "engine_ttft_ms": pct([r.engine_ttft_ms for r in engine]) if engine else None,
        "engine_server_ms": pct(lag) if served else None,
        "hop_ms": pct(hop) if served else None,
        "tokens": {"prompt": sum(r.prompt_tokens for r in ok),
                   "cached": sum(r.cached_tokens for r in ok),
                   "completion": sum(r.completion_tokens for r in ok)},
        "throughput": {"requests_per_s": len(ok) / sim_duration if sim_duration else None,
                       "output_tokens_per_s": sum(r.completion_tokens for r in ok) / sim_duration
                       if sim_duration else None},
        "hit_rate": hits / queries if queries else None,
        "fleet_counters": {"prefix_cache_queries": queries, "prefix_cache_hits": hits,
                           "request_success": fleet.get("vllm:request_success_total", 0.0),
                           "preemptions": fleet.get("vllm:num_preemptions_total", 0.0)},
        "client_cached_fraction": (sum(r.cached_tokens for r in ok)
                                   / max(1, sum(r.prompt_tokens for r in ok))),
        "workers": workers,
        "load": {"requests_max_over_mean": _ratio_max_mean(reqs),
                 "busy_max_over_mean": _ratio_max_mean(busy) if busy else None},
        "reasons": _count(r.reason for r in records if r.reason),
        "router_cpu": {"seconds": router_cpu_s,
                       "us_per_request": router_cpu_s / len(ok) * 1e6
                       if router_cpu_s is not None and ok else None},
        "bounds": dict(bounds) if bounds else None,
        "errors": sorted({r.error for r in records if r.error})[:10],
        "records": [r.as_dict() for r in records],
    }


def engine_ttft(result: Mapping[str, Any]) -> dict[str, float | None]:
    """A result's engine TTFT percentiles: exact per request from simulators, else vLLM's
    histogram (bucketed)."""
    return result.get("engine_ttft_ms") or result["worker_ttft_ms"]


def _join_engine_ttfts(ok: Sequence[Record],
                       engine_ttfts: Mapping[str, tuple[float, float | None]]) -> list[Record]:
    """Set each record's engine and engine server TTFT from the engines' own log, by
    response id; returns the records that have one."""
    joined = []
    for r in ok:
        ttfts = engine_ttfts.get(r.response_id) if r.response_id else None
        if ttfts is not None and r.first_token_s is not None:
            r.engine_ttft_ms = ttfts[0] * 1000.0
            r.server_ttft_ms = None if ttfts[1] is None else ttfts[1] * 1000.0
            joined.append(r)
    return joined


def histogram_ms(snap: Mapping[str, float], name: str) -> dict[str, float | None]:
    out = {f"p{int(q * 100)}": scrape.histogram_quantile(snap, name, q) for q in (0.5, 0.9, 0.99)}
    out["mean"] = scrape.histogram_mean(snap, name)
    return {k: (v * 1000.0 if v is not None else None) for k, v in out.items()}


def _count(items: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return out
