"""Clocks: how simulated seconds map onto real time.

``ScaledClock`` sleeps for real (simulated seconds x ``time_scale``), for servers under
load tests. ``VirtualClock`` does not sleep at all: simulated time jumps forward, for
benches and tests that only need the model's numbers; one is one engine's clock.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Simulated seconds since the clock started."""

    async def sleep_until(self, sim_time: float) -> None:
        """Until the clock reads ``sim_time``: at once when it is already past it, so an
        engine whose loop was late (a busy CPU) catches up with its model instead of
        carrying the delay into every later step."""


class ScaledClock:
    def __init__(self, time_scale: float = 1.0) -> None:
        if time_scale < 0:
            raise ValueError("time_scale must be >= 0")
        self.time_scale = time_scale
        self._t0 = time.monotonic()

    def now(self) -> float:
        if self.time_scale == 0:
            return 0.0
        return (time.monotonic() - self._t0) / self.time_scale

    async def sleep_until(self, sim_time: float) -> None:
        await asyncio.sleep(max(0.0, (sim_time - self.now()) * self.time_scale))


class VirtualClock:
    def __init__(self) -> None:
        self._now = 0.0

    def now(self) -> float:
        return self._now

    def advance(self, sim_seconds: float) -> None:
        self._now += max(0.0, sim_seconds)

    async def sleep_until(self, sim_time: float) -> None:
        self.advance(sim_time - self._now)
        await asyncio.sleep(0)
