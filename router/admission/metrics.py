"""Admission's Prometheus series, in the router app's registry (the README lists them)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

WAIT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)


class AdmissionMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.depth = Gauge("prefix_router_admission_queue_depth", "Requests waiting in the "
                           "router's admission queue", ["model", "priority", "tenant"],
                           registry=r)
        self.wait = Histogram("prefix_router_admission_queue_wait_seconds", "Time a request "
                              "waited in the admission queue (dispatched, shed or gone)",
                              ["model", "priority", "tenant"], buckets=WAIT_BUCKETS,
                              registry=r)
        self.admitted = Counter("prefix_router_admission_admitted", "Requests admitted, "
                                "directly or after queueing", ["model", "path"], registry=r)
        self.shed = Counter("prefix_router_admission_shed", "Requests answered 429 by "
                            "admission, by reason (queue_full, predicted_wait, deadline, "
                            "tenant_limit)", ["model", "reason"], registry=r)
        self.abandoned = Counter("prefix_router_admission_abandoned", "Requests whose client "
                                 "went away while queued (no worker saw them)", ["model"],
                                 registry=r)
        self.tenant_tokens = Counter("prefix_router_tenant_uncached_tokens", "Predicted "
                                     "uncached prompt tokens admitted, per tenant (what "
                                     "fairness charges)", ["tenant"], registry=r)
        self.lateness = Gauge("prefix_router_admission_engine_lateness_seconds", "90th "
                              "percentile of first bytes past their predicted TTFT; the "
                              "router's queue budget shrinks by it", registry=r)
        self.limits_shared = Gauge("prefix_router_tenant_limits_shared", "1 while tenant "
                                   "limits are shared through Redis, 0 while local",
                                   registry=r)
