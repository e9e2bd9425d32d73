"""The admission queue's order: priority first, then DRR between tenants on uncached tokens."""

from __future__ import annotations

import pytest

from router.admission.buckets import Bucket
from router.admission.queue import ModelQueue, QueueFull
from router.admission.ticket import Ticket


def ticket(tenant: str, cost: float, priority: int = 0) -> Ticket:
    return Ticket("m", tenant, priority, cost, 0.0, 60.0)


def drain(queue: ModelQueue) -> list[Ticket]:
    out = []
    while (t := queue.pop()) is not None:
        out.append(t)
    return out


async def test_a_flooding_tenant_does_not_starve_the_others() -> None:
    queue = ModelQueue(1000, 1e9, quantum=1000)
    for _ in range(20):
        queue.push(ticket("heavy", 1000))
    for name in ("b", "c"):
        for _ in range(2):
            queue.push(ticket(name, 1000))
    first_six = [t.tenant for t in drain(queue)[:6]]
    assert first_six.count("b") == 2 and first_six.count("c") == 2


async def test_tenants_are_charged_on_uncached_tokens_not_requests() -> None:
    """A tenant whose prompts hit the cache (cost 100) gets ten requests per cold one."""
    queue = ModelQueue(1000, 1e9, quantum=500)
    for _ in range(40):
        queue.push(ticket("warm", 100))
        queue.push(ticket("cold", 1000))
    served = {"warm": 0.0, "cold": 0.0}
    counts = {"warm": 0, "cold": 0}
    for t in drain(queue)[:33]:
        served[t.tenant] += t.cost
        counts[t.tenant] += 1
    assert counts["warm"] >= 8 * counts["cold"]
    assert abs(served["warm"] - served["cold"]) <= 1000  # equal tokens, within one request


async def test_lower_priority_value_is_served_first_as_in_vllm() -> None:
    queue = ModelQueue(100, 1e9, quantum=1000)
    queue.push(ticket("a", 10, priority=5))
    queue.push(ticket("a", 10, priority=0))
    queue.push(ticket("b", 10, priority=-1))
    assert [t.priority for t in drain(queue)] == [-1, 0, 5]


async def test_work_ahead_grows_with_the_queue_and_counts_fair_shares() -> None:
    queue = ModelQueue(100, 1e9, quantum=1000)
    assert queue.ahead("a", 0, 1000) == 0
    queue.push(ticket("a", 1000))
    one = queue.ahead("a", 0, 1000)
    queue.push(ticket("a", 1000))
    assert queue.ahead("a", 0, 1000) > one
    for _ in range(10):
        queue.push(ticket("heavy", 1000))
    # a light tenant waits for its own queue and as much again of the heavy one, not all of it
    assert queue.ahead("b", 0, 1000) == 1000 + 1000  # min(queued, 1000) of a and of heavy
    assert queue.ahead("a", 0, 1000) == 2000 + 3000  # own 2000, heavy's min(10000, 3000)
    assert queue.ahead("a", -1, 1000) == 0  # more urgent than all of it


async def test_the_queue_is_bounded_in_requests_and_tokens() -> None:
    by_count = ModelQueue(2, 1e9, quantum=1000)
    by_count.push(ticket("a", 1))
    by_count.push(ticket("a", 1))
    with pytest.raises(QueueFull):
        by_count.push(ticket("a", 1))
    by_tokens = ModelQueue(100, 5000, quantum=1000)
    by_tokens.push(ticket("a", 3000))
    with pytest.raises(QueueFull):
        by_tokens.push(ticket("b", 2500))
    assert by_tokens.remove(by_tokens.pop() or ticket("x", 0)) is False
    by_tokens.push(ticket("b", 2500))  # room again once the first left


def test_a_local_bucket_keeps_its_share_of_the_limit() -> None:
    bucket = Bucket.full(rate=10.0, burst=20.0, now=0.0)
    bucket.go_local(0.5, now=0.0)  # two routers: each keeps half
    assert bucket.wait_s(10.0, now=0.0) == 0.0
    bucket.spend(10.0, shared=False)
    assert bucket.wait_s(1.0, now=0.0) == pytest.approx(1.0 / 5.0)
    assert bucket.unsynced == 0.0  # local spending is not owed to the fleet later
