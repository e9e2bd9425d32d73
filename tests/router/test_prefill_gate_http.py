"""The prefill gate through the router over real HTTP, against the simulator's engine: a
stream that would fill the last prefill step of the prompt ahead waits for that prompt's
first byte, and the prompt ahead gets its first token as if it were alone.

The figures compared are the engine's own TTFTs on its model clock (the simulator's
request log), which depend on which step each prompt joined, not on this machine's speed.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from bench.workloads.text import block_text
from tests.router.sim_fleet import MODEL, sim_fleet

AHEAD_TOKENS, FOLLOWER_TOKENS = 12_000, 6_000  # the ahead's second 8,192-token step has
# ~4,400 tokens of room, which the follower's first tokens fill unless it is held


async def _stream(http: aiohttp.ClientSession, url: str, prompt: str) -> None:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 2, "stream": True}
    async with http.post(f"{url}/v1/completions", json=body) as resp:
        assert resp.status == 200
        await resp.read()


async def _pair(gate_ms: float) -> tuple[dict[str, Any], dict[str, Any], float]:
    """The ahead's and the follower's engine records, and the router's holds."""
    async with sim_fleet(1, time_scale=1.0, max_model_len=32_768,
                         prefill_gate_ms=gate_ms) as fleet, \
            aiohttp.ClientSession() as http:
        cost = fleet.state().pool.get("w0").cost  # type: ignore[union-attr]
        ahead = asyncio.create_task(_stream(http, fleet.url, block_text("a", 0, AHEAD_TOKENS)))
        for _ in range(2500):  # until dispatched: its first step (~0.3 s) has begun
            if cost.pending:
                break
            await asyncio.sleep(0.002)
        await _stream(http, fleet.url, block_text("f", 0, FOLLOWER_TOKENS))
        await ahead
        async with http.get(f"{fleet.urls['w0']}/sim/requests") as resp:
            served = await resp.json()
        holds = fleet.state().metrics.prefill_holds._value.get()
    big, small = sorted(served, key=lambda r: -r["prompt_tokens"])
    return big, small, holds


async def test_a_held_follower_leaves_the_prompt_ahead_its_own_last_step() -> None:
    held_ahead, held_follower, holds = await _pair(gate_ms=30.0)
    sent_ahead, sent_follower, none = await _pair(gate_ms=0.0)
    assert (holds, none) == (1, 0)
    assert held_ahead["prompt_tokens"] == sent_ahead["prompt_tokens"]
    # sent at once, the follower's first ~4,400 tokens share the ahead's second step
    # (~0.15 s of an H100's prefill); held, that step carries the ahead's tokens alone
    assert held_ahead["ttft_s"] < sent_ahead["ttft_s"] - 0.1
    # held, the follower reached an engine that had finished the ahead's prefill: its own
    # prefill alone, shorter than the ahead's
    assert held_follower["ttft_s"] < held_ahead["ttft_s"]
    assert sent_follower["ttft_s"] > held_follower["ttft_s"]
