"""Read the workers' own Prometheus counters and histograms, before and after a run.

The fleet hit rate the bench reports is computed from these deltas only, so it is the
workers' figure by construction, not the client's estimate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

Snapshot = dict[str, float]  # sample name (+ "|le=" for buckets) -> value, summed over labels

COUNTERS = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
            "vllm:request_success_total", "vllm:prompt_tokens_total",
            "vllm:generation_tokens_total", "vllm:num_preemptions_total")
HISTOGRAMS = ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds")


def parse(text: str) -> Snapshot:
    out: Snapshot = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = s.name
            if s.name.endswith("_bucket"):
                key += "|le=" + s.labels.get("le", "")
            out[key] = out.get(key, 0.0) + float(s.value)
    return out


async def scrape(session: aiohttp.ClientSession, urls: Sequence[str]) -> list[Snapshot]:
    snaps = []
    for url in urls:
        async with session.get(url + "/metrics") as resp:
            snaps.append(parse(await resp.text()))
    return snaps


async def engine_ttfts(session: aiohttp.ClientSession, urls: Sequence[str]
                       ) -> dict[str, tuple[float, float | None]]:
    """Response id -> (the engine's TTFT, its server's) in simulated seconds, from each
    simulator's ``GET /sim/requests``; an engine without it (vLLM) adds nothing."""
    out: dict[str, tuple[float, float | None]] = {}
    for url in urls:
        async with session.get(url + "/sim/requests") as resp:
            if resp.status != 200:
                continue
            out.update((r["id"], (r["ttft_s"], r.get("server_ttft_s")))
                       for r in await resp.json())
    return out


def delta(before: Mapping[str, float], after: Mapping[str, float]) -> Snapshot:
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}


def add(snaps: Sequence[Mapping[str, float]]) -> Snapshot:
    total: Snapshot = {}
    for s in snaps:
        for k, v in s.items():
            total[k] = total.get(k, 0.0) + v
    return total


def histogram_quantile(snap: Mapping[str, float], name: str, q: float) -> float | None:
    """Quantile from cumulative buckets with linear interpolation (as PromQL does)."""
    prefix = name + "_bucket|le="
    buckets = sorted((float(k[len(prefix):]), v) for k, v in snap.items() if k.startswith(prefix))
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    prev_le, prev_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return prev_le
            if count == prev_count:
                return le
            return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = le, count
    return prev_le


def histogram_mean(snap: Mapping[str, float], name: str) -> float | None:
    count = snap.get(name + "_count", 0.0)
    return snap.get(name + "_sum", 0.0) / count if count else None


ROUTER_COUNTERS = ("prefix_router_cached_tokens_predicted_total",
                   "prefix_router_cached_tokens_actual_total",
                   "prefix_router_residency_corrections_total",
                   "prefix_router_residency_dropped_blocks_total")


def router_counters(snap: Snapshot) -> dict[str, float]:
    """prefix-router's own view at the end of a run: what it predicted the engines would
    find cached against what they found, and how often it dropped residency for it. Read
    against the workers' counters, it tells a decision that went wrong from a picture
    that did."""
    return {name.removeprefix("prefix_router_"): snap.get(name, 0.0) for name in ROUTER_COUNTERS}
