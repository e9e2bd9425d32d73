"""One worker's streams before their first byte, in dispatch order, and those held back.

An engine prefills in steps of at most ``--max-num-batched-tokens`` tokens, running
requests first, then waiting ones in arrival order. A request that arrives while another
is mid-prefill fills what the step finishing that prompt leaves, and that prompt's first
token comes as much later: up to one full step, ~300 ms for an 8 k-token chunk of an 8 B
model on an H100. The newcomer gains nothing from it (it finishes with the same total
work ahead of it either way). So a stream whose first tokens would cost the prompt
ahead more than ``--prefill-gate-ms`` is held here until every stream dispatched to the
worker before it has its first byte, then sent: it starts in a step of its own, a step's
overhead and one hop later, and the prompt ahead keeps its predicted TTFT (offline RAG:
96-114 of 1,200 requests held, p99 536 / 574 / 523 -> 522 / 536 / 514 ms on seeds 0-2).

Only streams take a place: a non-streamed answer's first byte is its last, and holding
others until then would hold them for its whole decode. Only this router's own
dispatches are ordered; another replica's land in the engine as they come.
"""

from __future__ import annotations

import asyncio
from collections import deque


class Ticket:
    """A stream's place in its worker's order; ``held`` until the ones before it clear."""

    __slots__ = ("_opened", "held")

    def __init__(self, held: bool) -> None:
        self.held = held
        self._opened: asyncio.Event | None = None

    def open(self) -> None:
        self.held = False
        if self._opened is not None:
            self._opened.set()


class PrefillGate:
    __slots__ = ("_order",)

    def __init__(self) -> None:
        self._order: deque[Ticket] = deque()

    def __len__(self) -> int:
        return len(self._order)

    def enter(self, hold: bool) -> Ticket:
        """A stream dispatched now; ``hold``: send it only after those before it clear
        (nothing before it: nothing to wait for)."""
        ticket = Ticket(hold and bool(self._order))
        self._order.append(ticket)
        return ticket

    def leave(self, ticket: Ticket) -> None:
        """Its first byte, or its end without one: the next held stream may go once it is
        first in line."""
        order = self._order
        if order and order[0] is ticket:
            order.popleft()
        else:
            try:
                order.remove(ticket)
            except ValueError:
                return
        ticket.open()  # a held stream that leaves (its client went) holds nothing up
        if order and order[0].held:
            order[0].open()

    async def wait(self, ticket: Ticket) -> None:
        """Until ``ticket`` may be sent: at once unless it is held."""
        if not ticket.held:
            return
        if ticket._opened is None:
            ticket._opened = asyncio.Event()
        await ticket._opened.wait()
