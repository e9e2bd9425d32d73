"""One try of a request on one worker, as the worker's cost sees it.

Dispatch adds the request's predicted prefill work (its uncached tokens, attention
included) to the worker's pending prefill;
a ``gated`` stream (one the edge sends itself, under a policy that predicts, with the gate
on) takes its place in the worker's prefill gate (router/fleet/prefill_gate.py),
held there when ``hold`` says its first tokens would delay the prompt ahead (the proxy
awaits ``cleared`` before sending); its first byte moves it to decoding (the engine has
computed the prompt, so the prompt is recorded as resident there, on the worker that
actually served it); its end removes it.
The proxy drives an Attempt through these calls; ``end`` runs in its ``finally`` so a
failure or a client that goes away never leaves phantom load behind.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from router.fleet.prefill_gate import Ticket
from router.fleet.worker_cost import WorkerCost
from router.fleet.workers import Worker
from router.routing.candidate import Candidate
from router.routing.request import RoutingRequest
from router.routing.usage import MARK, TAIL, Usage, find_usage


class Attempt:
    __slots__ = ("_carry", "_chain", "_on_first_byte", "ahead_tokens", "candidate", "ended",
                 "first_byte_s", "observer", "request", "stamp", "started", "stream", "ticket",
                 "usage", "worker")

    def __init__(self, request: RoutingRequest, candidate: Candidate, stream: bool,
                 on_first_byte: Callable[[Attempt], None], now: float | None = None,
                 gated: bool = False, hold: bool = False) -> None:
        self.request = request
        self.candidate = candidate
        self.worker: Worker = candidate.worker
        self.stream = stream
        self._on_first_byte = on_first_byte
        self.first_byte_s: float | None = None
        self.usage: Usage | None = None
        self._carry = b""  # the end of a read that stopped inside an event or a body
        self.ended = False
        self.stamp: int | None = None  # residency stamp of the oldest predicted-warm block
        self.observer: Callable[[Attempt, bytes], None] | None = None  # sees what saw sees
        self.started = now = time.monotonic() if now is None else now
        cost = self.worker.cost
        self.ahead_tokens = cost.queued_tokens(now)
        self.ticket: Ticket | None = cost.gate.enter(hold) if stream and gated else None
        cost.dispatched(candidate.prefill_work, now, candidate.uncached_tokens,
                        fresh=self.held)
        # its prefix is warm there for whatever queues behind it (exact residency sees
        # the engine's own KV events instead)
        self._chain = None if request.exact or not request.key.chain else request.key.chain
        if self._chain is not None:
            cost.prefilling.append(self._chain)

    @property
    def held(self) -> bool:
        return self.ticket is not None and self.ticket.held

    async def cleared(self) -> None:
        """Until the worker's prefill gate lets this try be sent."""
        if self.ticket is not None:
            await self.worker.cost.gate.wait(self.ticket)

    def first_byte(self, now: float | None = None) -> None:
        """``now``: on the clock the attempt started on (the offline bench's simulated one)."""
        if self.first_byte_s is not None:
            return
        now = time.monotonic() if now is None else now
        self.first_byte_s = now - self.started
        cost = self.worker.cost
        if self.ticket is not None:
            cost.gate.leave(self.ticket)
        self._prefilled(cost)
        cost.prefilled(self.candidate.prefill_work, now)
        cost.decoding += 1
        self._on_first_byte(self)

    def saw(self, data: bytes) -> None:
        """A body or stream chunk; the one carrying usage is kept for ``complete``. A read
        can stop inside the usage object (seen on the bench: a few per cent of streams),
        so a read that does not end an SSE line carries its last ``TAIL`` bytes into the
        next; stream reads almost always end one, and then nothing is copied."""
        self.worker.heard_s = time.monotonic()
        if self.observer is not None:
            self.observer(self, data)
        if self._carry:
            data = self._carry + data
        if MARK in data or b'"usage": {' in data:
            found = find_usage(data)
            if found is not None:
                self.usage = found
        self._carry = b"" if data.endswith(b"\n") else data[-TAIL:]

    def end(self) -> None:
        if self.ended:
            return
        self.ended = True
        cost = self.worker.cost
        if self.first_byte_s is None:
            if self.ticket is not None:
                cost.gate.leave(self.ticket)
            self._prefilled(cost)
            cost.abandoned(self.candidate.prefill_work)
        else:
            cost.decoding -= 1

    def _prefilled(self, cost: WorkerCost) -> None:
        """Its prefix is no longer being computed: resident now (recorded on first byte),
        or never (it failed)."""
        if self._chain is not None:
            cost.prefilling.remove(self._chain)
            self._chain = None
