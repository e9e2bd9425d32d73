"""The engines' own view of their queues, folded into each worker's cost.

A router knows the prefill it dispatched; an engine also queues what other routers, or
clients that bypass them, sent. From each scrape: requests waiting beyond this router's
own pending ones, priced at the mean uncached prompt this router sends the worker, are
prefill no router accounts for; running beyond our decodes (and other replicas') are
decodes no router accounts for. Both are smoothed like the request-count excess
(router/fleet/load.py) so one request caught in a scrape does not read as sustained load.
"""

from __future__ import annotations

from router.fleet.workers import Worker
from router.protocol.vllm_metrics import EngineStats

ALPHA = 0.25


def observe_engine(worker: Worker, gauges: EngineStats, mean_uncached: float) -> None:
    cost = worker.cost
    waiting = max(0.0, gauges.waiting - cost.pending)
    running = max(0.0, gauges.running - cost.decoding - cost.shared_decoding)
    tokens = max(0.0, waiting * mean_uncached - cost.shared_pending_tokens)
    cost.engine_excess_tokens += ALPHA * (tokens - cost.engine_excess_tokens)
    cost.engine_excess_decoding += ALPHA * (running - cost.engine_excess_decoding)
    cost.kv_usage = min(1.0, max(0.0, gauges.kv_usage))
