"""The router's queue for one model: bounded in requests and in prompt tokens, strict
priority between levels (lower first, as vLLM orders ``priority``), DRR within a level."""

from __future__ import annotations

from router.admission.fairness import DeficitRoundRobin
from router.admission.ticket import Ticket


class QueueFull(Exception):
    """The queue holds ``max_requests`` requests or ``max_tokens`` prompt tokens already."""


class ModelQueue:
    def __init__(self, max_requests: int, max_tokens: float, quantum: float) -> None:
        self._max_requests = max_requests
        self._max_tokens = max_tokens
        self._quantum = quantum
        self._levels: dict[int, DeficitRoundRobin] = {}
        self.size = 0
        self.cost = 0.0

    def __len__(self) -> int:
        return self.size

    def fits(self, cost: float) -> bool:
        return self.size < self._max_requests and self.cost + cost <= self._max_tokens

    def push(self, ticket: Ticket) -> None:
        if not self.fits(ticket.cost):
            raise QueueFull
        level = self._levels.get(ticket.priority)
        if level is None:
            level = self._levels[ticket.priority] = DeficitRoundRobin(self._quantum)
        level.push(ticket)
        self.size += 1
        self.cost += ticket.cost

    def pop(self) -> Ticket | None:
        for priority in sorted(self._levels):
            ticket = self._levels[priority].pop()
            if ticket is not None:
                self._settle(priority, ticket)
                return ticket
        return None

    def remove(self, ticket: Ticket) -> bool:
        level = self._levels.get(ticket.priority)
        if level is None or not level.remove(ticket):
            return False
        self._settle(ticket.priority, ticket)
        return True

    def ahead(self, tenant: str, priority: int, cost: float) -> float:
        """Prompt tokens dispatched before a new request: every more urgent level whole,
        and its fair share of its own level."""
        total = sum(level.cost for p, level in self._levels.items() if p < priority)
        level = self._levels.get(priority)
        return total + (level.ahead(tenant, cost) if level is not None else 0.0)

    def _settle(self, priority: int, ticket: Ticket) -> None:
        ticket.queued = False
        self.size -= 1
        self.cost -= ticket.cost
        if not self._levels[priority]:
            del self._levels[priority]
