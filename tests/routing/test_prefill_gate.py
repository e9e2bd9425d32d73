"""The prefill gate: a stream that would fill the last step of the prompt queued ahead on
its worker waits for that prompt's first byte; the rest go at once, in their order."""

from __future__ import annotations

import asyncio

import pytest

from router.fleet.prefill_gate import PrefillGate
from router.fleet.prefill_model import PrefillModel
from router.fleet.worker_cost import WorkerCost
from router.fleet.workers import Worker, WorkerPool
from router.infra.metrics import RouterMetrics
from router.residency.memory import MemoryResidency
from router.routing.accounting import Attempt
from router.routing.candidate import Candidate
from router.routing.keys import RoutingKey
from router.routing.pipeline import Pipeline
from router.routing.policies import make_policy
from router.routing.request import RoutingRequest

RATE = 20_000.0


async def settled(task: asyncio.Task[None]) -> bool:
    """Whether ``task`` has finished once every ready callback has run."""
    for _ in range(3):
        await asyncio.sleep(0)
    return task.done()


async def test_a_held_ticket_waits_for_the_one_ahead_and_the_next_for_it() -> None:
    gate = PrefillGate()
    first = gate.enter(hold=True)  # nothing ahead: nothing to wait for
    second, third = gate.enter(hold=True), gate.enter(hold=True)
    assert not first.held and second.held and third.held
    waits = [asyncio.create_task(gate.wait(t)) for t in (first, second, third)]
    assert [await settled(w) for w in waits] == [True, False, False]
    gate.leave(first)
    assert [await settled(w) for w in waits[1:]] == [True, False]  # one at a time
    gate.leave(second)
    assert await settled(waits[2])
    gate.leave(third)
    assert len(gate) == 0


async def test_a_stream_that_is_not_held_goes_at_once_past_a_held_one() -> None:
    gate = PrefillGate()
    ahead = gate.enter(hold=False)
    held = gate.enter(hold=True)
    small = gate.enter(hold=False)  # its first tokens cost the prompt ahead little
    assert await settled(asyncio.create_task(gate.wait(small)))
    waiting = asyncio.create_task(gate.wait(held))
    gate.leave(small)  # its first byte says nothing of the prompt before the held one
    assert not await settled(waiting)
    gate.leave(ahead)
    assert await settled(waiting)


async def test_a_held_stream_whose_client_left_holds_nothing_up() -> None:
    gate = PrefillGate()
    ahead = gate.enter(hold=False)
    gone, next_one = gate.enter(hold=True), gate.enter(hold=True)
    waiting = asyncio.create_task(gate.wait(next_one))
    gate.leave(gone)  # ended before it was sent
    assert not await settled(waiting)  # still behind the prompt ahead
    gate.leave(ahead)
    assert await settled(waiting)
    gate.leave(gone)  # twice: nothing happens
    assert len(gate) == 1


def test_a_held_dispatch_starts_a_step_of_its_own() -> None:
    """The room a later request fills is counted from the held one's tokens: it reaches
    the engine after the prompt ahead has had its first token, in a fresh step."""
    cost = WorkerCost(prefill=PrefillModel(seed_rate=RATE))
    cost.dispatched(12_000, now=0.0, tokens=12_000)
    assert cost.busy_tokens == 12_000
    cost.dispatched(5_000, now=0.1, tokens=5_000, fresh=True)
    assert cost.busy_tokens == 5_000
    # 3,192 tokens of room left in its first step: a 6,000-token follower fills it
    assert cost.step_delay_s(6_000, 0.0, 6_000, 8192) == pytest.approx(3_192 / RATE)
    cost.dispatched(1_000, now=0.2, tokens=1_000)
    assert cost.busy_tokens == 6_000


def _pipeline(gate_s: float, policy: str = "predicted_ttft") -> tuple[Pipeline, Worker]:
    pool = WorkerPool()
    worker = Worker(id="w0", url="http://w0", healthy=True,
                    cost=WorkerCost(prefill=PrefillModel(seed_rate=RATE)))
    pool.add(worker)
    pipeline = Pipeline(pool, make_policy(policy), MemoryResidency(), RouterMetrics(),
                        block_chars=64, max_blocks=64, key_blocks=8, prefill_gate_s=gate_s,
                        chunk_tokens=8192)
    return pipeline, worker


def _try(pipeline: Pipeline, worker: Worker, tokens: float, stream: bool = True,
         may_hold: bool = True) -> Attempt:
    """A try of a cold prompt of ``tokens``, annotated as the ttft signal would."""
    request = RoutingRequest(RoutingKey(f"ctx{tokens}", ()), tokens, 64.0)
    candidate = Candidate(worker, uncached_tokens=tokens, prefill_work=tokens)
    return pipeline.attempt(request, candidate, stream, may_hold=may_hold)


async def test_a_stream_that_would_fill_the_last_step_of_the_prompt_ahead_is_held() -> None:
    """A 12,000-token prompt's second step has 4,384 tokens of room: a 6,000-token stream
    would fill it (0.22 s later for that prompt) and waits for its first byte; a 200-token
    one (10 ms) goes at once, and so does every try the edge does not send itself."""
    pipeline, worker = _pipeline(gate_s=0.03)
    ahead = _try(pipeline, worker, 12_000)
    assert not ahead.held
    follower = _try(pipeline, worker, 6_000)
    assert follower.held  # and 2,192 tokens of room after it, in its own first step
    assert not _try(pipeline, worker, 200).held
    assert not _try(pipeline, worker, 6_000, stream=False).held  # its first byte is its last
    assert not _try(pipeline, worker, 6_000, may_hold=False).held  # the endpoint picker's
    assert len(worker.cost.gate) == 3  # the picker's try takes no place: Envoy sends it
    sent = asyncio.create_task(follower.cleared())
    assert not await settled(sent)
    ahead.first_byte()
    assert await settled(sent)
    assert pipeline.metrics.prefill_holds._value.get() == 1


@pytest.mark.parametrize(("gate_s", "policy"), [(0.0, "predicted_ttft"),
                                                (0.03, "llmd_weighted")])
async def test_nothing_is_held_with_the_gate_off_or_for_a_policy_without_predictions(
        gate_s: float, policy: str) -> None:
    """0 turns the gate off; a policy that reads no prediction (llm-d's reproduction, the
    peers' rules) annotates no uncached tokens, so its requests go as they always did."""
    pipeline, worker = _pipeline(gate_s, policy)
    _try(pipeline, worker, 12_000)
    request = RoutingRequest(RoutingKey("ctx", ()), 6_000, 64.0)
    annotated = Candidate(worker)  # what a policy without the ttft signal leaves
    unpredicted = pipeline.attempt(request, annotated, True, may_hold=True)
    assert not unpredicted.held
    if gate_s == 0.0:
        assert not _try(pipeline, worker, 6_000).held
    assert not worker.cost.gate  # and no stream took a place it could never be held in


async def test_a_held_try_that_ends_unsent_leaves_no_load_and_frees_the_next() -> None:
    pipeline, worker = _pipeline(gate_s=0.03)
    ahead = _try(pipeline, worker, 12_000)
    gone, next_one = _try(pipeline, worker, 6_000), _try(pipeline, worker, 6_000)
    assert gone.held and next_one.held
    gone.end()  # the client left while it was held
    assert worker.cost.pending == 2
    ahead.first_byte()
    assert await settled(asyncio.create_task(next_one.cleared()))
    next_one.first_byte()
    ahead.end()
    next_one.end()
    assert worker.cost.pending == 0 and worker.cost.decoding == 0
    assert len(worker.cost.gate) == 0
