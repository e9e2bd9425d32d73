"""The engines' own view of their queues, folded into each worker's cost.

A router knows the prefill it dispatched; an engine also queues what other routers, or
clients that bypass them, sent. From each scrape: requests waiting beyond this router's
own pending ones, priced at the mean uncached prompt this router sends the worker, are
prefill no router accounts for; running beyond our decodes (and other replicas') are
decodes no router accounts for. Both are smoothed like the request-count excess
(router/fleet/load.py) so one request caught in a scrape does not read as sustained load.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from router.fleet.workers import Worker

ALPHA = 0.25
WAITING, RUNNING = "vllm:num_requests_waiting", "vllm:num_requests_running"
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
WANTED = (WAITING, RUNNING, *KV_USAGE)


@dataclass(frozen=True, slots=True)
class EngineGauges:
    waiting: float
    running: float
    kv_usage: float  # mean over the engine's data-parallel ranks


def parse_engine_gauges(text: str) -> EngineGauges | None:
    """The three gauges, summed (counts) or averaged (usage) over label sets."""
    sums = {WAITING: 0.0, RUNNING: 0.0}
    usage, ranks, seen = 0.0, 0, False
    for line in text.splitlines():
        if not line.startswith(WANTED):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        try:
            value = float(line.rsplit(" ", 1)[1])
        except (IndexError, ValueError):
            continue
        if not math.isfinite(value):
            continue
        if name in sums:
            sums[name] += value
            seen = True
        elif name in KV_USAGE:
            usage += value
            ranks += 1
    if not seen:
        return None
    return EngineGauges(sums[WAITING], sums[RUNNING], usage / ranks if ranks else 0.0)


def observe_engine(worker: Worker, gauges: EngineGauges, mean_uncached: float) -> None:
    cost = worker.cost
    waiting = max(0.0, gauges.waiting - cost.pending)
    running = max(0.0, gauges.running - cost.decoding - cost.shared_decoding)
    tokens = max(0.0, waiting * mean_uncached - cost.shared_pending_tokens)
    cost.engine_excess_tokens += ALPHA * (tokens - cost.engine_excess_tokens)
    cost.engine_excess_decoding += ALPHA * (running - cost.engine_excess_decoding)
    cost.kv_usage = min(1.0, max(0.0, gauges.kv_usage))
