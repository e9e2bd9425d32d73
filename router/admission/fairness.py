"""Deficit round robin between tenants, charged on uncached prompt tokens.

Shreedhar and Varghese's DRR: each tenant with work waiting is visited in turn and earns
``quantum`` tokens of credit per visit; it sends its oldest request once its credit covers
that request's cost. Over any contended stretch every backlogged tenant is served the same
uncached tokens (to within one request), however many requests it sends, so a tenant that
floods the router queues behind itself, not in front of the others.
"""

from __future__ import annotations

from collections import OrderedDict, deque

from router.admission.ticket import Ticket


class DeficitRoundRobin:
    def __init__(self, quantum: float) -> None:
        self._quantum = quantum
        self._queues: OrderedDict[str, deque[Ticket]] = OrderedDict()  # visiting order
        self._deficit: dict[str, float] = {}
        self._cost: dict[str, float] = {}  # queued cost per tenant
        self.size = 0
        self.cost = 0.0

    def __len__(self) -> int:
        return self.size

    def push(self, ticket: Ticket) -> None:
        queue = self._queues.get(ticket.tenant)
        if queue is None:
            queue = self._queues[ticket.tenant] = deque()
            self._deficit[ticket.tenant] = 0.0
        queue.append(ticket)
        self._cost[ticket.tenant] = self._cost.get(ticket.tenant, 0.0) + ticket.cost
        self.size += 1
        self.cost += ticket.cost

    def pop(self) -> Ticket | None:
        """The next request in DRR order; the tenant at the head keeps its turn while its
        credit lasts, then goes to the back with what is left over."""
        while self._queues:
            tenant, queue = next(iter(self._queues.items()))
            head = queue[0]
            if self._deficit[tenant] >= head.cost:
                self._deficit[tenant] -= head.cost
                queue.popleft()
                self._account(tenant, head)
                if not queue:  # an idle tenant keeps no credit (DRR's rule)
                    self._drop(tenant)
                return head
            self._deficit[tenant] += self._quantum
            self._queues.move_to_end(tenant)
        return None

    def remove(self, ticket: Ticket) -> bool:
        queue = self._queues.get(ticket.tenant)
        if queue is None:
            return False
        try:
            queue.remove(ticket)
        except ValueError:
            return False
        self._account(ticket.tenant, ticket)
        if not queue:
            self._drop(ticket.tenant)
        return True

    def ahead(self, tenant: str, cost: float) -> float:
        """Uncached tokens served before a new request of ``tenant`` costing ``cost``: its
        own tenant's queue, and from each other tenant as much again (DRR's equal shares),
        at most all that tenant has queued."""
        mine = self._cost.get(tenant, 0.0)
        share = mine + cost
        others = sum(min(c, share) for t, c in self._cost.items() if t != tenant)
        return mine + others

    def _account(self, tenant: str, ticket: Ticket) -> None:
        self._cost[tenant] -= ticket.cost
        self.size -= 1
        self.cost -= ticket.cost

    def _drop(self, tenant: str) -> None:
        del self._queues[tenant]
        del self._deficit[tenant]
        self._cost.pop(tenant, None)
