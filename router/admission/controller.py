"""Admission control: dispatch now, queue in the router, or answer 429.

A request is dispatched at once when nothing of its model waits in the router and some
worker can start it (router/admission/capacity.py): the lightly loaded fleet pays one
pass over its workers and nothing else. Otherwise it joins its model's queue, unless the
queue is full or the work ahead of it predicts a wait past ``max_queue_wait_s``: then
429 with that prediction as Retry-After. Queued requests leave in priority then DRR order
whenever capacity frees (a first byte, a tick), one at a time per model, each routed by
the edge at that moment, so it gets the warm worker as the fleet stands then.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from router.admission.capacity import measure
from router.admission.limits import TenantLimits
from router.admission.metrics import AdmissionMetrics
from router.admission.queue import ModelQueue
from router.admission.retry_after import Capacity, drain_seconds
from router.admission.ticket import Ticket
from router.fleet.workers import Worker
from router.routing.accounting import Attempt
from router.routing.errors import Rejected

LATE_QUANTILE = 0.9
LATE_STEP_S = 0.02


@dataclass(frozen=True, slots=True)
class AdmissionSettings:
    max_queue_wait_s: float  # wait before prefill starts: router queue + engine queue
    engine_queue_s: float  # predicted backlog a worker may hold before requests wait here
    saturation_kv: float
    max_queue_requests: int
    max_queue_tokens: float
    quantum_tokens: float
    tick_s: float = 0.05


class Shed(Rejected):
    """429 in OpenAI's shape with the predicted drain time as Retry-After."""

    def __init__(self, reason: str, message: str, retry_after: float) -> None:
        super().__init__(429, message, reason,
                         retry_after=None if math.isinf(retry_after) else retry_after)


class Admission:
    def __init__(self, settings: AdmissionSettings,
                 workers: Callable[[str | None], list[Worker]],
                 metrics: AdmissionMetrics, limits: TenantLimits | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._settings = settings
        self._workers = workers
        self._metrics = metrics
        self.limits = limits  # per-tenant buckets, when configured
        self._clock = clock
        self._queues: dict[str, ModelQueue] = {}
        self._transit: dict[str, Ticket] = {}  # granted, not yet dispatched to a worker
        self._scheduled = False
        self._late_s = 0.0  # the engines' first bytes past their predicted TTFT, 90th pct

    @property
    def _budget_s(self) -> float:
        """What a request may wait here: the rest of ``max_queue_wait_s`` goes to the engine's
        allowance and to how late the engines have been against their predictions."""
        s = self._settings
        return max(0.0, s.max_queue_wait_s - s.engine_queue_s - self._late_s)

    def arrive(self, model: str | None, tenant: str, priority: int,
               cost: float) -> Ticket | None:
        """None: dispatch now. A Ticket: wait on it. Raises Shed."""
        name = model or ""
        if self.limits is not None and (wait := self.limits.check(tenant, cost)) > 0:
            self._metrics.shed.labels(name, "tenant_limit").inc()
            raise Shed("tenant_limit", f"tenant {tenant!r} is over its rate limit", wait)
        queue = self._queues.get(name)
        capacity = self.capacity(model)
        if not queue and name not in self._transit and capacity.ready:
            self._admitted(name, tenant, cost, "direct")
            return None
        if queue is None:
            s = self._settings
            queue = self._queues[name] = ModelQueue(s.max_queue_requests, s.max_queue_tokens,
                                                    s.quantum_tokens)
        wait = drain_seconds(capacity, queue.ahead(tenant, priority, cost))
        if not queue.fits(cost):
            self._metrics.shed.labels(name, "queue_full").inc()
            raise Shed("queue_full", "the router's queue for this model is full", wait)
        if wait > self._budget_s:
            self._metrics.shed.labels(name, "predicted_wait").inc()
            raise Shed("predicted_wait", f"predicted wait {wait:.1f} s exceeds the "
                       f"{self._settings.max_queue_wait_s:g} s allowed", wait)
        now = self._clock()
        ticket = Ticket(name, tenant, priority, cost, now, now + self._budget_s)
        queue.push(ticket)
        self._metrics.depth.labels(name, str(priority), tenant).inc()
        self.wake()
        return ticket

    async def wait(self, ticket: Ticket, at_most: float = math.inf) -> bool:
        """True once granted; False after ``at_most`` seconds (for keep-alives). Raises
        Shed at the deadline. The caller calls ``leave`` if it stops waiting otherwise."""
        left = ticket.deadline - self._clock()
        timeout = min(at_most, left)
        if not ticket.granted.done() and timeout > 0:
            await asyncio.wait((ticket.granted,), timeout=timeout)
        if ticket.granted.done():
            return True
        if at_most < left:
            return False
        self._remove(ticket)
        queue = self._queues[ticket.model]
        self._metrics.shed.labels(ticket.model, "deadline").inc()
        wait = drain_seconds(self.capacity(ticket.model or None),
                             queue.ahead(ticket.tenant, ticket.priority, ticket.cost))
        raise Shed("deadline", f"not admitted within {self._settings.max_queue_wait_s:g} s",
                   wait)

    def leave(self, ticket: Ticket) -> None:
        """The request is gone (client disconnected, write failed): out of the queue now."""
        if ticket.queued:
            self._remove(ticket)
            self._metrics.abandoned.labels(ticket.model).inc()
        else:
            self.dispatched(ticket)

    def dispatched(self, ticket: Ticket) -> None:
        """The granted request is on a worker's books (or gone): the next may go."""
        if self._transit.get(ticket.model) is ticket:
            del self._transit[ticket.model]
            self.wake()

    def observe(self, attempt: Attempt) -> None:
        """A first byte (a prefill ended, capacity freed): track how late it came against
        its predicted TTFT, a streaming 90th percentile (step LATE_STEP_S)."""
        predicted = attempt.candidate.ttft_s
        if predicted > 0 and attempt.first_byte_s is not None:
            above = attempt.first_byte_s - predicted > self._late_s
            self._late_s = max(0.0, self._late_s + LATE_STEP_S * (above - (1 - LATE_QUANTILE)))
            self._metrics.lateness.set(self._late_s)
        self.wake()

    def capacity(self, model: str | None) -> Capacity:
        s = self._settings
        return measure(self._workers(model), s.engine_queue_s, s.saturation_kv)

    def wake(self) -> None:
        """Capacity may have freed: pump once the running handler yields (by then any
        request it just dispatched is on its worker's books)."""
        if not self._scheduled and any(self._queues.values()):
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._pump)

    async def run(self) -> None:
        """The tick: engines' scraped queues and failed tries free capacity silently."""
        while True:
            await asyncio.sleep(self._settings.tick_s)
            self.wake()

    def _pump(self) -> None:
        self._scheduled = False
        for name, queue in self._queues.items():
            if not queue or name in self._transit or not self.capacity(name or None).ready:
                continue
            ticket = queue.pop()
            assert ticket is not None
            self._left(ticket)
            self._transit[name] = ticket
            self._admitted(name, ticket.tenant, ticket.cost, "queued")
            ticket.granted.set_result(None)

    def _remove(self, ticket: Ticket) -> None:
        queue = self._queues.get(ticket.model)
        if queue is not None and queue.remove(ticket):
            self._left(ticket)

    def _left(self, ticket: Ticket) -> None:
        labels = (ticket.model, str(ticket.priority), ticket.tenant)
        self._metrics.depth.labels(*labels).dec()
        self._metrics.wait.labels(*labels).observe(self._clock() - ticket.arrived)

    def _admitted(self, model: str, tenant: str, cost: float, path: str) -> None:
        self._metrics.admitted.labels(model, path).inc()
        self._metrics.tenant_tokens.labels(tenant).inc(cost)
