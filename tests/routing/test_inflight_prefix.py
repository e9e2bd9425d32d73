"""A prefix still computing on a worker counts as cached there for a request queued behind
it: the engine caches a prompt's blocks as it computes them (router/routing/signals/
residency.py)."""

from __future__ import annotations

import asyncio

import pytest

from router.fleet.prefill_model import PrefillModel
from router.fleet.worker_cost import WorkerCost
from router.fleet.workers import Worker, WorkerPool
from router.infra.metrics import RouterMetrics
from router.residency.memory import MemoryResidency
from router.routing.accounting import Attempt
from router.routing.candidate import Candidate
from router.routing.keys import prompt_key
from router.routing.pipeline import Pipeline
from router.routing.policies import make_policy
from router.routing.policies.base import Decision
from router.routing.request import RoutingRequest
from router.routing.usage import Usage

RATE = 20_000.0  # prefill tokens a second, every worker
BLOCK_CHARS = 64
DOCUMENT = b"".join(b"%06d retrieved passage text for the in-flight test. " % i
                    for i in range(400))  # ~24 KB: a long shared context


def fleet(n: int = 2) -> tuple[Pipeline, MemoryResidency]:
    pool = WorkerPool()
    for i in range(n):
        pool.add(Worker(id=f"w{i}", url=f"http://w{i}", healthy=True,
                        cost=WorkerCost(prefill=PrefillModel(seed_rate=RATE))))
    residency = MemoryResidency()
    pipeline = Pipeline(pool, make_policy("predicted_ttft"), residency, RouterMetrics(),
                        block_chars=BLOCK_CHARS, max_blocks=64, key_blocks=8)
    return pipeline, residency


async def decide(pipeline: Pipeline, prompt: bytes) -> tuple[RoutingRequest, Decision]:
    view = pipeline.fleet(None)
    request = await pipeline.key({}, "m", False, lambda _: prompt, None, view)
    candidates = await pipeline.candidates(request, view)
    await pipeline.annotate(request, candidates)
    return request, pipeline.rank(request, candidates)


def on(decision: Decision, worker_id: str) -> Candidate:
    return next(c for c in decision.ranked if c.id == worker_id)


async def send(pipeline: Pipeline, prompt: bytes) -> Attempt:
    """Decide and dispatch a stream, as the proxy does; no first byte yet."""
    request, decision = await decide(pipeline, prompt)
    return pipeline.attempt(request, decision.ranked[0], stream=True)


async def test_a_question_behind_its_document_counts_the_document_as_cached() -> None:
    """The second question on a document arrives while the first is still computing it:
    on that worker its predicted prefill is its own question, not the document again, and
    it stays there; on the other worker it is the whole prompt."""
    pipeline, _ = fleet()
    first = await send(pipeline, DOCUMENT + b"Question one: what is in flight?")
    home = first.worker.id
    _, decision = await decide(pipeline, DOCUMENT + b"Question two: and what is warm?")
    there, elsewhere = on(decision, home), next(c for c in decision.ranked if c.id != home)
    assert there.matched_blocks == 0  # nothing recorded: no first byte yet
    assert there.inflight_tokens == there.cached_tokens > 0.9 * len(DOCUMENT) / 4
    assert elsewhere.cached_tokens == 0
    assert there.uncached_tokens < 50
    assert decision.ranked[0].id == home


@pytest.mark.parametrize("outcome", ["first_byte", "failed"])
async def test_the_credit_ends_with_the_prefill(outcome: str) -> None:
    """At its first byte the prefix is recorded resident instead; a try that fails before
    it leaves nothing behind."""
    pipeline, _ = fleet()
    first = await send(pipeline, DOCUMENT + b"Question one: what is in flight?")
    assert first.worker.cost.prefilling
    if outcome == "first_byte":
        first.first_byte()
    first.end()
    await asyncio.sleep(0)  # the residency store applies its batched records
    assert not first.worker.cost.prefilling
    _, decision = await decide(pipeline, DOCUMENT + b"Question two: and what is warm?")
    there = on(decision, first.worker.id)
    assert there.inflight_tokens == 0
    if outcome == "first_byte":
        assert there.matched_blocks > 0 and there.cached_tokens > 0.9 * len(DOCUMENT) / 4
    else:
        assert there.cached_tokens == 0


async def test_an_in_flight_prefix_the_engine_did_not_find_is_not_an_eviction() -> None:
    """The closed loop drops a worker's residency older than a block the engine found cold
    where the store said warm; a shortfall on the part credited only in flight proves
    nothing about the store (the prompt ahead may have failed), so an older context there
    stays resident."""
    pipeline, residency = fleet()
    older = prompt_key(b"an older context " * 300, "m", BLOCK_CHARS, 64, 8).chain
    opening = DOCUMENT[: len(DOCUMENT) // 2]
    residency.record("w0", older)
    residency.record("w0", prompt_key(opening, "m", BLOCK_CHARS, 64, 8).chain)
    await asyncio.sleep(0)
    first = await send(pipeline, DOCUMENT + b"Question one: what is in flight?")
    assert first.worker.id == "w0"  # it holds the opening
    request, decision = await decide(pipeline, DOCUMENT + b"Question two: and what is warm?")
    there = on(decision, "w0")
    assert there.matched_blocks > 0 and there.inflight_tokens > 0
    second = pipeline.attempt(request, there, stream=True)
    # the engine reused the opening only: the prompt ahead had not computed the rest
    second.usage = Usage(round(request.prompt_tokens),
                         round(there.cached_tokens - there.inflight_tokens))
    second.end()
    pipeline.complete([second])
    await asyncio.sleep(0)
    assert (await residency.match(older, ["w0"])).get("w0") == len(older)
    assert pipeline.metrics.residency_dropped._value.get() == 0
