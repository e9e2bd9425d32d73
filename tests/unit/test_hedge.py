"""Hedging's budget and race in process."""

from __future__ import annotations

import asyncio

import pytest

from router.server.hedge import BURST, HedgeBudget, first_of


def test_hedges_never_exceed_their_share_of_requests() -> None:
    budget = HedgeBudget(0.05)
    taken = 0
    for _ in range(1000):
        budget.on_request()
        taken += budget.take()
    assert taken == 50
    calm = HedgeBudget(0.5)
    for _ in range(100):
        calm.on_request()
    assert sum(calm.take() for _ in range(100)) == BURST  # a calm spell saves a burst only


async def test_first_answer_wins_and_the_loser_is_cancelled() -> None:
    cancelled = []

    async def slow() -> str:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.append("slow")
            raise
        return "slow"

    async def fast() -> str:
        await asyncio.sleep(0.01)
        return "fast"

    assert await first_of(slow(), 0.01, fast) == ("fast", True)
    assert cancelled == ["slow"]
    assert await first_of(fast(), 1.0, lambda: None) == ("fast", False)


async def test_a_failing_hedge_leaves_the_field_to_the_primary() -> None:
    async def primary() -> str:
        await asyncio.sleep(0.05)
        return "primary"

    async def broken() -> str:
        raise ConnectionError("no")

    assert await first_of(primary(), 0.01, broken) == ("primary", False)
    with pytest.raises(ConnectionError):
        await first_of(broken(), 0.01, broken)
