"""Per-worker circuit breaker: stop sending to a worker that keeps failing, probe it later."""

from __future__ import annotations

import time
from enum import StrEnum


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    """Opens after ``threshold`` straight failures; after ``cooldown_s`` lets one probe through."""

    __slots__ = ("_failures", "_opened_at", "_probe_out", "cooldown_s", "threshold")

    def __init__(self, threshold: int = 3, cooldown_s: float = 5.0) -> None:
        self.threshold = threshold
        self.cooldown_s = cooldown_s
        self._failures = 0
        self._opened_at: float | None = None
        self._probe_out = False

    @property
    def state(self) -> BreakerState:
        if self._opened_at is None:
            return BreakerState.CLOSED
        if time.monotonic() - self._opened_at >= self.cooldown_s:
            return BreakerState.HALF_OPEN
        return BreakerState.OPEN

    def allows(self) -> bool:
        if self._opened_at is None:  # closed: the common case, asked per worker per request
            return True
        state = self.state
        return state is BreakerState.CLOSED or (state is BreakerState.HALF_OPEN
                                                 and not self._probe_out)

    def on_dispatch(self) -> None:
        if self.state is BreakerState.HALF_OPEN:
            self._probe_out = True

    def on_abandoned(self) -> None:
        """A try that ended with no verdict (the client went away mid-probe): the probe slot
        is free again, or a healthy worker would stay half-open and unused for good."""
        self._probe_out = False

    def on_success(self) -> None:
        self._failures = 0
        self._opened_at = None
        self._probe_out = False

    def on_failure(self) -> None:
        self._failures += 1
        self._probe_out = False
        if self._failures >= self.threshold or self._opened_at is not None:
            self._opened_at = time.monotonic()
