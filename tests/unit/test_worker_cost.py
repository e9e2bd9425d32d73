"""A worker's prefill queue, as the router counts it: it drains at the learned rate."""

from __future__ import annotations

from router.fleet.prefill_model import PrefillModel
from router.fleet.worker_cost import WorkerCost


def cost(rate: float = 10_000.0) -> WorkerCost:
    return WorkerCost(prefill=PrefillModel(seed_rate=rate), drains=True)


def test_without_the_drain_the_queue_is_every_pending_requests_whole_work() -> None:
    c = WorkerCost(prefill=PrefillModel(seed_rate=10_000.0))
    c.dispatched(8000, now=100.0)
    assert c.own_queue(105.0) == 8000
    c.prefilled(8000, now=105.0)
    assert c.own_queue(105.0) == 0.0


def test_the_queue_drains_at_the_worker_rate_from_a_dispatch_to_an_empty_queue() -> None:
    c = cost()
    c.dispatched(8000, now=100.0)
    c.dispatched(4000, now=100.2)  # queued behind: the drain started at 100.0
    assert c.own_queue(100.0) == 12_000
    assert abs(c.own_queue(100.5) - 7000) < 1e-6  # 0.5 s at 10 k tokens/s
    assert c.own_queue(102.0) == 0.0  # never negative
    assert c.queued_tokens(100.5) == c.own_queue(100.5)  # no other replica, no engine excess


def test_a_first_byte_says_where_the_engine_is() -> None:
    c = cost()
    c.dispatched(8000, now=0.0)
    c.dispatched(4000, now=0.1)
    c.prefilled(8000, now=1.5)  # slower than predicted: the rest starts only now
    assert c.own_queue(1.5) == 4000
    assert abs(c.own_queue(1.7) - 2000) < 1e-6
    c.abandoned(4000)  # the second went away before its first byte
    assert c.pending == 0 and c.own_queue(1.7) == 0.0
    c.dispatched(1000, now=5.0)  # an empty queue again: drains from its own dispatch
    assert c.own_queue(5.0) == 1000
