"""Prometheus metrics of one router app, in its own registry (no process-global state)."""

from __future__ import annotations

import contextlib
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class RouterMetrics:
    """Every name is prefixed ``prefix_router_``; the README's Metrics section lists them."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("prefix_router_requests", "Requests answered, by route, worker "
                                "and status", ["route", "worker", "status"], registry=r)
        self.decisions = Counter("prefix_router_routing_decisions", "Routing decisions by policy "
                                 "and reason (warm, ring, spill, failover, ...)",
                                 ["policy", "reason"], registry=r)
        self.decision_mode = Counter("prefix_router_routing_key_source", "Where the routing key "
                                     "came from (header; precise: vLLM block hashes vs KV events; "
                                     "prompt: text blocks)", ["source"], registry=r)
        self.retries = Counter("prefix_router_retries", "Attempts moved to another worker, by "
                               "cause", ["cause"], registry=r)
        self.stream_resumes = Counter("prefix_router_stream_resumes", "Streams broken after "
                                      "their first byte, by outcome: resumed on another "
                                      "worker, complete (nothing was missing), limit, "
                                      "tool_calls, no_worker", ["outcome"], registry=r)
        self.epp_observations = Counter("prefix_router_epp_observations", "Endpoint-picker "
                                        "exchanges by how their observed response body "
                                        "ended: observed (to its last chunk), cut (the "
                                        "observer stream ended first), expired (no end by "
                                        "the grace), unmatched (no open exchange had its "
                                        "id)",
                                        ["outcome"], registry=r)
        self.hedges = Counter("prefix_router_hedges", "Requests also sent to the next worker "
                              "because their first byte was late (sent), and those the "
                              "second worker answered first (won)", ["outcome"], registry=r)
        self.prefill_holds = Counter("prefix_router_prefill_holds", "Streams held until the "
                                     "streams dispatched before them to their worker had "
                                     "their first byte, because their first tokens would "
                                     "have delayed the prompt ahead (--prefill-gate-ms)",
                                     registry=r)
        self.latency = Histogram("prefix_router_request_latency_seconds", "Request latency "
                                 "through the router", ["route"], buckets=LATENCY_BUCKETS,
                                 registry=r)
        self.ttfb = Histogram("prefix_router_time_to_first_byte_seconds", "Time to the first "
                              "response byte from upstream", ["route"], buckets=LATENCY_BUCKETS,
                              registry=r)
        self.in_flight = Gauge("prefix_router_worker_in_flight", "Requests in flight per worker "
                               "(this router)", ["worker"], registry=r)
        self.healthy = Gauge("prefix_router_worker_healthy", "1 when the worker passes health "
                             "checks", ["worker"], registry=r)
        self.residency = Counter("prefix_router_residency_lookups", "Routing decisions that "
                                 "found the prompt warm on the chosen worker (hit) or not (miss)",
                                 ["result"], registry=r)
        self.redis_errors = Counter("prefix_router_redis_errors", "Redis calls that failed or "
                                    "timed out, by operation", ["op"], registry=r)
        self.redis_latency = Histogram("prefix_router_redis_latency_seconds", "Redis call "
                                       "latency by operation", ["op"],
                                       buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05,
                                                0.1), registry=r)
        self.residency_dropped_records = Counter(
            "prefix_router_residency_dropped_records", "Residency records lost to a full "
            "write queue while Redis was away (RedisResidency)", registry=r)
        self.background_errors = Counter("prefix_router_background_errors", "Exceptions that "
                                         "ended a background task (restarted with backoff), "
                                         "by task", ["task"], registry=r)

        self._routing_metrics()
        self._children: dict[tuple[object, tuple[str, ...]], Any] = {}

    def child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, cached: ``labels`` validates, locks and builds a key
        on every call, and a request makes about seven of them."""
        key = (metric, labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def _routing_metrics(self) -> None:
        """The predicted-TTFT loop: what the router predicted, what the engines found."""
        r = self.registry
        self.cached_predicted = Counter("prefix_router_cached_tokens_predicted", "Prompt tokens "
                                        "the router predicted the serving engine would find "
                                        "cached (answers with usage)", registry=r)
        self.cached_actual = Counter("prefix_router_cached_tokens_actual", "Prompt tokens the "
                                     "engines reported cached (usage.prompt_tokens_details"
                                     ".cached_tokens)", registry=r)
        self.cache_prediction_error = Histogram(
            "prefix_router_cache_prediction_error_ratio", "|predicted - actual cached tokens| "
            "/ prompt tokens per answer: the router's routing precision (the direction is in "
            "the predicted and actual totals)",
            buckets=(0.02, 0.05, 0.1, 0.25, 0.5, 0.75, 1), registry=r)
        self.residency_corrections = Counter("prefix_router_residency_corrections", "Answers "
                                             "whose engine found cold a prefix predicted warm "
                                             "(residency older than it was dropped)",
                                             ["worker"], registry=r)
        self.residency_dropped = Counter("prefix_router_residency_dropped_blocks", "Residency "
                                         "blocks dropped by those corrections", registry=r)
        self.context_replicas = Histogram("prefix_router_context_replicas", "Live replicas of "
                                          "the routed context, per decision",
                                          buckets=(1, 2, 3, 4, 6, 8, 16), registry=r)
        self.pending_prefill = Gauge("prefix_router_worker_pending_prefill_tokens", "Predicted "
                                     "uncached prompt tokens queued on the worker (all routers "
                                     "and the engine's excess)", ["worker"], registry=r)
        self.decode_load = Gauge("prefix_router_worker_decode_load", "Requests past their "
                                 "first byte on the worker", ["worker"], registry=r)
        self.prefill_rate = Gauge("prefix_router_worker_prefill_tokens_per_second", "Learned "
                                  "prefill rate of the worker", ["worker"], registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def forget_worker(self, worker_id: str) -> None:
        self._children.clear()  # no cached child may outlive the one the registry removes
        for gauge in (self.in_flight, self.healthy, self.pending_prefill, self.decode_load,
                      self.prefill_rate):
            with contextlib.suppress(KeyError):
                gauge.remove(worker_id)
