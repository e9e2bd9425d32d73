"""Whether a model's fleet can start one more request now, from the workers' own costs.

A worker can when its predicted prefill backlog (pending uncached tokens of every router
and the engine's own excess, at its learned rate) is within ``engine_queue_s`` and its KV
cache is below ``saturation_kv``. The allowance keeps the engines busy (the next prefill
is already queued when one ends) while everything beyond it waits in the router, where it
can be ordered, shed with an honest Retry-After, and routed when it is dispatched.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from router.admission.retry_after import Capacity
from router.fleet.workers import Worker


def measure(workers: Iterable[Worker], engine_queue_s: float,
            saturation_kv: float) -> Capacity:
    rate = 0.0
    best = math.inf  # least backlog among unsaturated workers
    any_best = math.inf  # among all, for the drain estimate when every one is saturated
    for worker in workers:
        cost = worker.cost
        worker_rate = cost.prefill.rate
        rate += worker_rate
        wait = cost.queued_tokens() / worker_rate
        any_best = min(any_best, wait)
        if cost.kv_usage < saturation_kv:
            best = min(best, wait)
    if rate <= 0:
        return Capacity(False, math.inf, 0.0)
    ready = best <= engine_queue_s
    backlog = max(0.0, (best if best < math.inf else any_best) - engine_queue_s)
    if best == math.inf:  # KV-saturated everywhere: decodes must finish first
        backlog = max(backlog, engine_queue_s)
    return Capacity(ready, backlog, rate)
