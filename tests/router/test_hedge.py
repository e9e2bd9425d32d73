"""Hedged first bytes over real processes: a worker that stalls before its first byte.

One simulated worker sleeps 3 s before answering anything (``--stall-ms``), the other
answers at once. With hedging on, a request ranked onto the stalled worker goes to the
other one too once its predicted TTFT has passed ``--hedge-factor`` times over, and the
first answer wins: no answer may come from the stalled worker.
"""

from __future__ import annotations

from collections.abc import Iterator

import aiohttp
import pytest

from tests.redis.fleet import MODEL, Fleet, Proc


@pytest.fixture
def stalled_pair() -> Iterator[tuple[Proc, Proc, Proc]]:
    fleet = Fleet()
    try:
        fast = fleet.sim("fast", None, time_scale=1.0)
        slow = fleet.sim("slow", None, "--stall-ms", "3000", time_scale=1.0)
        router = fleet.router("router", None, [fast, slow], hedge_share=1.0,
                              health_interval_s=60)
        yield fast, slow, router
    finally:
        fleet.close()


async def test_a_late_first_byte_is_hedged_and_the_first_answer_wins(
        stalled_pair: tuple[Proc, Proc, Proc]) -> None:
    _, slow, router = stalled_pair
    served = []
    async with aiohttp.ClientSession() as http:
        for i in range(8):
            body = {"model": MODEL, "max_tokens": 4, "stream": i % 2 == 0,
                    "messages": [{"role": "user", "content": f"context {i} " * 40}]}
            async with http.post(router.url + "/v1/chat/completions", json=body) as resp:
                raw = await resp.read()
                assert resp.status == 200, raw
                served.append(resp.headers["X-Prefix-Router-Worker"])
        async with http.get(router.url + "/metrics") as resp:
            metrics = await resp.text()
    assert slow.name not in served
    won = [r for r in metrics.splitlines()
           if r.startswith('prefix_router_hedges_total{outcome="won"}')]
    assert won and float(won[0].split()[-1]) >= 1  # some were ranked onto the slow one
