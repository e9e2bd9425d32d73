"""Hedged first bytes: a request slow to start on its worker also goes to the next one.

When the first byte has not come within ``factor`` x the request's predicted TTFT
(router/routing/signals/ttft.py), the next ranked worker is tried too; the first to
answer wins and the other is cancelled (its leg closed, its accounting undone). Hedges
spend a budget that every request fills by ``share``, so they never exceed that share of
traffic (plus a small burst), and a fleet that is slow everywhere is not doubled.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")
BURST = 5.0  # hedges that may be spent at once after a calm spell
MIN_WAIT_S = 0.05  # never hedge sooner: a predicted TTFT of a few ms is within jitter


def hedge_wait_s(predicted_ttft_s: float, factor: float) -> float:
    return max(MIN_WAIT_S, factor * predicted_ttft_s)


class HedgeBudget:
    """A token bucket filled by ``share`` per request, capped at ``BURST``."""

    __slots__ = ("_credit", "share")

    def __init__(self, share: float) -> None:
        self.share = share
        self._credit = 0.0

    def on_request(self) -> None:
        self._credit = min(BURST, self._credit + self.share)

    def take(self) -> bool:
        if self._credit < 1.0:
            return False
        self._credit -= 1.0
        return True


async def first_of(primary: Awaitable[T], after_s: float,
                   hedge: Callable[[], Awaitable[T] | None]) -> tuple[T, bool]:
    """``primary``'s result, or, when it takes longer than ``after_s`` and ``hedge()``
    gives a second try, whichever succeeds first; True when the hedge won. One that fails
    leaves the field to the other; the loser is cancelled. Both failing raises the
    primary's error."""
    first = asyncio.ensure_future(primary)
    second: asyncio.Future[T] | None = None
    try:
        done, _ = await asyncio.wait({first}, timeout=after_s)
        if done:
            return first.result(), False
        started = hedge()
        if started is None:
            return await first, False
        second = asyncio.ensure_future(started)
        pending: set[asyncio.Future[T]] = {first, second}
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task.exception() is None:
                    return task.result(), task is second
        return first.result(), False  # both failed: the primary's error
    finally:
        for task in (first, second):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
