"""Prometheus view of precise mode, read at scrape time from the feeds (no extra state).

Why a collector rather than counters updated by the subscribers: the subscriber already
counts everything in ``SubscriberStats``; reading those at scrape time keeps the event path
free of metric calls and can't drift from what the subscriber did.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from router.precise.feeds import KVEventFeeds


class PreciseCollector(Collector):
    def __init__(self, feeds: KVEventFeeds) -> None:
        self._feeds = feeds

    def collect(self) -> Iterator[Metric]:
        resident = GaugeMetricFamily(
            "prefix_router_precise_resident_blocks", "Blocks each worker reported stored and "
            "not removed (exact residency from its KV events)", labels=["worker"])
        events = CounterMetricFamily(
            "prefix_router_kv_events", "KV-event subscriber activity per worker: batches "
            "applied, sequence gaps, batches replayed, resets (cache picture cleared), "
            "undecodable messages", labels=["worker", "kind"])
        for worker_id in self._feeds.worker_ids():
            resident.add_metric([worker_id], self._feeds.residency.count(worker_id))
            sub = self._feeds.subscriber(worker_id)
            if sub is None:
                continue
            stats = sub.stats
            for kind, value in (("batches", stats.batches), ("gaps", stats.gaps),
                                ("replayed", stats.replayed), ("resets", stats.resets),
                                ("decode_errors", stats.decode_errors)):
                events.add_metric([worker_id, kind], value)
        yield resident
        yield events
