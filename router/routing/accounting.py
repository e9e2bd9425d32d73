"""One try of a request on one worker, as the worker's cost sees it.

Dispatch adds the request's predicted uncached tokens to the worker's pending prefill;
its first byte moves it to decoding (the engine has computed the prompt, so the prompt is
recorded as resident there, on the worker that actually served it); its end removes it.
The proxy drives an Attempt through these calls; ``end`` runs in its ``finally`` so a
failure or a client that goes away never leaves phantom load behind.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from router.fleet.workers import Worker
from router.routing.candidate import Candidate
from router.routing.request import RoutingRequest
from router.routing.usage import MARK, Usage, find_usage


class Attempt:
    __slots__ = ("_on_first_byte", "ahead_tokens", "candidate", "ended", "first_byte_s",
                 "observer", "request", "stamp", "started", "stream", "usage", "worker")

    def __init__(self, request: RoutingRequest, candidate: Candidate, stream: bool,
                 on_first_byte: Callable[[Attempt], None]) -> None:
        self.request = request
        self.candidate = candidate
        self.worker: Worker = candidate.worker
        self.stream = stream
        self._on_first_byte = on_first_byte
        self.first_byte_s: float | None = None
        self.usage: Usage | None = None
        self.ended = False
        self.stamp: int | None = None  # residency stamp of the oldest predicted-warm block
        self.observer: Callable[[Attempt, bytes], None] | None = None  # sees what saw sees
        cost = self.worker.cost
        self.ahead_tokens = cost.queued_tokens()
        cost.pending_tokens += candidate.uncached_tokens
        cost.pending += 1
        self.started = time.perf_counter()

    def first_byte(self) -> None:
        if self.first_byte_s is not None:
            return
        self.first_byte_s = time.perf_counter() - self.started
        cost = self.worker.cost
        cost.pending_tokens = max(0.0, cost.pending_tokens - self.candidate.uncached_tokens)
        cost.pending -= 1
        cost.decoding += 1
        self._on_first_byte(self)

    def saw(self, data: bytes) -> None:
        """A body or stream chunk; the one carrying usage is kept for ``complete``."""
        self.worker.heard_s = time.monotonic()
        if self.observer is not None:
            self.observer(self, data)
        if MARK in data or b'"usage": {' in data:
            found = find_usage(data)
            if found is not None:
                self.usage = found

    def end(self) -> None:
        if self.ended:
            return
        self.ended = True
        cost = self.worker.cost
        if self.first_byte_s is None:
            cost.pending_tokens = max(0.0, cost.pending_tokens - self.candidate.uncached_tokens)
            cost.pending -= 1
        else:
            cost.decoding -= 1
