"""predicted_ttft on candidates annotated by hand: the guard, stickiness, cost, replicas."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.fleet.prefill_model import PrefillModel, leading_work, prefill_work
from router.fleet.workers import Worker
from router.residency.memory import MemoryResidency
from router.routing.candidate import Candidate
from router.routing.keys import RoutingKey
from router.routing.policies.bound import load_bound
from router.routing.policies.predicted_ttft import PredictedTTFT
from router.routing.replicas import ReplicaSets
from router.routing.request import RoutingRequest
from router.routing.signals.base import SignalContext
from router.routing.signals.ttft import TTFTSignal

RATE = 20_000.0  # tokens/s of every worker's seed line


def pool(n: int, loads: Sequence[int] | None = None,
         capacity_blocks: int = 0) -> list[Worker]:
    """``capacity_blocks``: each engine's KV cache in 16-token blocks (0: not scraped yet)."""
    loads = loads or [0] * n
    return [Worker(id=f"w{i}", url=f"http://w{i}", in_flight=loads[i], healthy=True,
                   capacity_blocks=capacity_blocks, block_size=16) for i in range(n)]


def request(context: str, tokens: float = 4000.0, opener: int = 0,
            prefix: str = "opener") -> RoutingRequest:
    """A prompt of 64-token blocks, its own but for its first ``opener``, named ``prefix``
    (a system prompt every context starts with, a document several ask about)."""
    chain = tuple(f"{prefix}:{i}".encode() if i < opener else f"{context}:{i}".encode()
                  for i in range(max(1, math.ceil(tokens / 64))))
    return RoutingRequest(RoutingKey(context, chain), tokens, 64.0)


def annotate(workers: Sequence[Worker], req: RoutingRequest, cached: dict[str, float],
             queued: dict[str, float]) -> list[Candidate]:
    """What the residency, load and ttft signals would write, set by hand."""
    out = []
    for w in workers:
        c = Candidate(w, matched_blocks=int(cached.get(w.id, 0) // 64),
                      cached_tokens=cached.get(w.id, 0.0), queued_tokens=queued.get(w.id, 0.0))
        c.uncached_tokens = c.prefill_work = max(0.0, req.prompt_tokens - c.cached_tokens)
        c.ttft_s = (c.queued_tokens + c.uncached_tokens) / RATE
        out.append(c)
    return out


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@settings(max_examples=300, deadline=None)
@given(loads=st.lists(st.integers(0, 40), min_size=1, max_size=10),
       queued=st.lists(st.floats(0, 1e6), min_size=10, max_size=10),
       cached=st.lists(st.floats(0, 4000), min_size=10, max_size=10),
       margin=st.sampled_from([0, 2, 5]), context=st.text(min_size=1, max_size=8))
def test_never_over_the_bound_while_a_candidate_is_under_it(
        loads: list[int], queued: list[float], cached: list[float], margin: int,
        context: str) -> None:
    workers = pool(len(loads), loads)
    req = request(context)
    candidates = annotate(workers, req, {w.id: cached[i] for i, w in enumerate(workers)},
                          {w.id: queued[i] for i, w in enumerate(workers)})
    decision = PredictedTTFT(margin=margin).rank(req, candidates)
    bound = load_bound(sum(loads), len(loads), 0.25, margin)
    assert any(c.load + 1 <= bound for c in candidates)
    assert decision.ranked[0].load + 1 <= bound
    assert len({c.id for c in decision.ranked}) == len(decision.ranked)


def test_a_cold_key_stays_on_its_ring_owner_within_the_slack() -> None:
    policy = PredictedTTFT(cold_slack_s=0.01)
    workers = pool(4)
    req = request("cold-context")
    first = policy.rank(req, annotate(workers, req, {}, {}))
    owner = first.ranked[0]
    assert first.reason == "ring"
    assert policy.rank(req, annotate(workers, req, {}, {})).reason == "home"  # now its home
    # the owner has 100 tokens queued: 5 ms slower than an idle worker, within the slack
    kept = PredictedTTFT(cold_slack_s=0.01).rank(req, annotate(workers, req, {}, {owner.id: 100}))
    assert kept.ranked[0].id == owner.id and kept.reason == "ring"
    # 1,000 tokens queued (50 ms) is past it: the context starts where it starts soonest
    moved = PredictedTTFT(cold_slack_s=0.01).rank(
        req, annotate(workers, req, {}, {owner.id: 1000}))
    assert moved.ranked[0].id != owner.id and moved.reason == "cold"
    # a context its owner holds is not cold: 50 ms slower is within a move's slack
    stays = PredictedTTFT(cold_slack_s=0.01).rank(
        req, annotate(workers, req, {owner.id: 3000}, {owner.id: 4000}))
    assert stays.ranked[0].id == owner.id and stays.reason == "ring"


def test_a_long_cold_prompt_stays_home_unless_the_edge_beats_the_relative_slack() -> None:
    """A 12.7 s prediction is not known to the millisecond (live, predictions err by a few
    per cent): with an absolute 10 ms slack alone, a 15 ms edge moved a cold 120 k-token
    prompt off its ring owner, a coin toss on which two router replicas disagree."""
    workers = pool(4)
    req = request("long-cold-context", tokens=254_000.0)  # 12.7 s at RATE
    owner = PredictedTTFT().rank(req, annotate(workers, req, {}, {})).ranked[0]
    queued = {owner.id: 300.0}  # 15 ms behind the others: past a 10 ms slack
    absolute = PredictedTTFT(cold_slack_s=0.01, cold_slack_ratio=0.0)
    assert absolute.rank(req, annotate(workers, req, {}, queued)).reason == "cold"
    relative = PredictedTTFT(cold_slack_s=0.01, cold_slack_ratio=0.05)
    kept = relative.rank(req, annotate(workers, req, {}, queued))
    assert kept.ranked[0].id == owner.id and kept.reason == "ring"
    # 1 s behind (20,000 tokens queued) is past 5 % of 12.7 s: the context moves
    far = PredictedTTFT(cold_slack_s=0.01, cold_slack_ratio=0.05).rank(
        req, annotate(workers, req, {}, {owner.id: 20_000.0}))
    assert far.ranked[0].id != owner.id and far.reason == "cold"


def test_a_cold_start_is_decided_on_the_fleets_line_not_on_a_workers_own() -> None:
    """Workers' learned lines differ by their noise: a line 10 % optimistic must not draw
    every new context (seen live: 21-83 requests per worker on the Mooncake replay)."""
    fleet_line = PrefillModel(seed_rate=RATE)
    workers = pool(4)
    for w in workers:
        w.cost.prefill = fleet_line.child()
    req = request("cold-context", tokens=10_000.0)

    def placed(queued: dict[str, float]) -> tuple[str, str]:
        candidates = annotate(workers, req, {}, queued)
        for c in candidates:  # each priced on its own line, as the ttft signal does
            c.ttft_s = c.worker.cost.prefill.seconds(c.queued_tokens + c.prefill_work)
        decision = PredictedTTFT(cold_slack_s=0.01).rank(req, candidates)
        return decision.ranked[0].id, decision.reason

    owner, reason = placed({})
    assert reason == "ring"
    others = [w for w in workers if w.id != owner]
    next(w for w in workers if w.id == owner).cost.prefill.rate = RATE * 0.9
    others[0].cost.prefill.rate = RATE * 1.1  # its own line: 50 + 45 ms sooner
    assert placed({}) == (owner, "ring")
    # a queue on the owner is not noise: 1,000 tokens (50 ms on the fleet's line) moves it
    assert placed({owner: 1000.0})[1] == "cold"


def test_a_warm_worker_outside_the_home_wins_when_it_is_faster() -> None:
    policy = PredictedTTFT()
    workers = pool(4)
    req = request("ctx", tokens=8000)
    owner = policy.rank(req, annotate(workers, req, {}, {})).ranked[0].id
    warm = next(w.id for w in workers if w.id != owner)
    decision = PredictedTTFT().rank(req, annotate(workers, req, {warm: 7900}, {}))
    assert decision.ranked[0].id == warm and decision.reason == "warm"


async def test_predicted_ttft_grows_with_uncached_tokens_and_with_pending_prefill() -> None:
    signal = TTFTSignal(SignalContext(MemoryResidency(), decode_penalty_s=0.001,
                                      attention_tokens=32768))
    worker = Worker(id="w0", url="http://w0", healthy=True)
    worker.cost.prefill = PrefillModel(seed_rate=RATE, seed_base_s=0.02)

    async def ttft(tokens: float, cached: float, queued: float, decoding: int = 0) -> float:
        worker.cost.decoding = decoding
        c = Candidate(worker, cached_tokens=cached, queued_tokens=queued,
                      decode_load=worker.cost.decode_load())
        await signal.annotate(request("x", tokens), [c])
        return c.ttft_s

    base = await ttft(4000, 0, 0)
    assert await ttft(8000, 0, 0) > base  # more uncached tokens
    assert await ttft(4000, 2000, 0) < base  # fewer, thanks to the cache
    assert await ttft(4000, 0, 10_000) > base  # a queue ahead
    assert await ttft(4000, 0, 0, decoding=20) > base  # decodes share the steps
    assert abs(base - (0.02 + prefill_work(4000, 0, 32768) / RATE)) < 1e-9
    # the same 4,000 new tokens after 60,000 cached ones attend over all of them
    assert await ttft(64_000, 60_000, 0) > base * 2
    assert await ttft(8000, 0, 0) - 0.02 > 2 * (base - 0.02)  # superlinear in the prompt
    linear = TTFTSignal(SignalContext(MemoryResidency(), attention_tokens=0))
    c = Candidate(worker, cached_tokens=60_000)
    await linear.annotate(request("x", 64_000), [c])
    assert abs(c.ttft_s - (0.02 + 4000 / RATE)) < 1e-9  # 0: priced in plain tokens


def test_a_hot_context_gains_a_replica_and_later_loses_it() -> None:
    clock = Clock()
    replicas = ReplicaSets(idle_s=30.0, clock=clock)
    policy = PredictedTTFT(replicas=replicas)
    workers = pool(4)
    req = request("hot-doc")
    home = policy.rank(req, annotate(workers, req, {}, {})).ranked[0].id
    assert set(replicas.live("hot-doc")) == {home}
    for _ in range(2):  # requests keep coming: the document is hot
        policy.rank(req, annotate(workers, req, {home: 3900}, {}))
    assert replicas.is_hot("hot-doc")
    # the home holds the document but its queue is 2 s deep: one more replica
    hot = policy.rank(req, annotate(workers, req, {home: 3900}, {home: 40_000}))
    second = hot.ranked[0].id
    assert second != home and hot.reason == "replicate" and hot.replicas == 2
    assert set(replicas.live("hot-doc")) == {home, second}
    # while both are used, requests go to whichever replica is faster
    clock.now = 20.0
    back = policy.rank(req, annotate(workers, req, {home: 3900, second: 3900}, {second: 5000}))
    assert back.ranked[0].id == home
    # the second replica goes unused for longer than idle_s: it stops counting
    clock.now = 45.0
    policy.rank(req, annotate(workers, req, {home: 3900}, {}))
    assert set(replicas.live("hot-doc")) == {home}


@pytest.mark.parametrize("capacity_blocks", [0, 100_000])
def test_a_long_history_leaves_home_only_for_a_queue_longer_than_computing_it_twice(
        capacity_blocks: int) -> None:
    """A conversation's next turn: its history is large next to another worker's cache
    (11,500 tokens against 0.5 % of 1.6 M), or that cache's size is not known yet. A copy
    costs its prefill there (0.6 s) and as much again for the contexts it evicts, so a
    1.5 s queue at home is waited out, and a 10 s one (a long prompt ahead) is not."""
    policy = PredictedTTFT()
    workers = pool(4, capacity_blocks=capacity_blocks)
    req = request("conversation", tokens=12_000)
    home = policy.rank(req, annotate(workers, req, {}, {})).ranked[0].id
    turn = policy.rank(req, annotate(workers, req, {home: 11_500}, {home: 30_000}))
    assert not policy.replicas.is_hot("conversation")
    assert turn.ranked[0].id == home
    # the eviction's price is what keeps it: without it the same queue is left
    unpriced = PredictedTTFT(evict_cost=0.0)
    assert unpriced.rank(req, annotate(workers, req, {home: 11_500}, {home: 30_000})) \
        .ranked[0].id != home
    moved = policy.rank(req, annotate(workers, req, {home: 11_500}, {home: 200_000}))
    assert moved.ranked[0].id != home and moved.reason == "replicate"


def test_a_small_context_that_is_not_hot_leaves_a_queued_home() -> None:
    """A lukewarm document of a few thousand tokens: waiting 2 s on its warm home costs more
    than computing it on an idle worker, and the copy takes 0.2 % of that worker's cache."""
    policy = PredictedTTFT()
    workers = pool(4, capacity_blocks=100_000)  # 1.6 M tokens each; 0.5 % is 8,000
    req = request("lukewarm-doc", tokens=4000)
    home = policy.rank(req, annotate(workers, req, {}, {})).ranked[0].id
    moved = policy.rank(req, annotate(workers, req, {home: 3900}, {home: 40_000}))
    assert not policy.replicas.is_hot("lukewarm-doc")
    assert moved.ranked[0].id != home and moved.reason == "replicate"
    # with the home's queue short, the same copy is not worth its slack and extra prefill
    stay = PredictedTTFT().rank(req, annotate(workers, req, {home: 3900}, {home: 6000}))
    assert stay.ranked[0].id == home


def test_a_long_prompt_mostly_cold_leaves_a_warm_prefix_for_a_smaller_edge() -> None:
    """A 14 k-token RAG prompt whose leading document (2.5 k) is warm at home: the move
    gives up 18 % of the prompt, so the ratio slack shrinks to 36 % of itself, and a cold
    worker 0.3 s sooner takes it (0.70 s there against 1.0 s at home). A prompt half warm
    keeps the whole slack and stays behind an edge the smaller slack would not hold."""
    workers = pool(4, capacity_blocks=100_000)  # the 2.5 k copy is small: no eviction price
    policy = PredictedTTFT()
    req = request("retrieved-set", tokens=14_000)
    home = policy.rank(req, annotate(workers, req, {}, {})).ranked[0].id
    moved = policy.rank(req, annotate(workers, req, {home: 2500}, {home: 8500}))
    assert moved.ranked[0].id != home and moved.reason == "replicate"
    # the whole ratio would have asked for 0.70 x 1.25 + 0.05 + 0.125 = 1.05 s at home
    half = PredictedTTFT()
    short = request("half-warm", tokens=5000)
    home = half.rank(short, annotate(workers, short, {}, {})).ranked[0].id
    # 0.45 s at home against 0.25 s cold: past the slack with no ratio (0.425 s), within it
    # with the whole ratio (0.4875 s)
    kept = half.rank(short, annotate(workers, short, {home: 2500}, {home: 6500}))
    assert kept.ranked[0].id == home


def test_a_copy_is_priced_by_the_queue_of_the_worker_that_makes_it() -> None:
    """The copy's extra prefill delays those waiting behind it on the worker that computes
    it: an idle worker copies a hot document off a queued home even while the rest of the
    fleet is busy; one with requests waiting does not."""
    def placed(target_waiting: int) -> tuple[str, str]:
        policy = PredictedTTFT()
        workers = pool(4)
        req = request("hot-doc")
        home = policy.rank(req, annotate(workers, req, {}, {})).ranked[0].id
        for _ in range(2):
            policy.rank(req, annotate(workers, req, {home: 3900}, {}))
        assert policy.replicas.is_hot("hot-doc")
        target, *busy = [w for w in workers if w.id != home]
        target.cost.pending = target_waiting
        for w in busy:
            w.cost.pending = 10  # ten requests waiting on each, 2.5 s of prefill ahead
        queued = {home: 20_000} | {w.id: 50_000 for w in busy}
        return home, policy.rank(req, annotate(workers, req, {home: 3900}, queued)).ranked[0].id

    home, chosen = placed(target_waiting=0)
    assert chosen != home
    home, chosen = placed(target_waiting=5)
    assert chosen == home


@pytest.mark.parametrize("holders", [6, 2])
def test_a_prefix_several_workers_hold_does_not_starve_one_that_holds_none(
        holders: int) -> None:
    """A shared opener on six, or two, of eight workers: a new context owned by a fresh
    worker stays there, or the fresh worker would never get its first request (offline
    multiturn: a system prompt on 4 of 8 workers drew every new conversation there)."""
    workers = pool(8)
    policy = PredictedTTFT()
    req = request("new-context", tokens=12_000)
    owner = policy.rank(req, annotate(workers, req, {}, {})).ranked[0].id
    others = [w.id for w in workers if w.id != owner]
    opener = {w: 512.0 for w in others[:holders]}  # some workers, not the owner, have it
    fresh = PredictedTTFT().rank(req, annotate(workers, req, opener, {}))
    assert fresh.ranked[0].id == owner and fresh.reason == "ring"


@pytest.mark.parametrize("chunk_tokens", [8192, 0])
def test_a_request_does_not_delay_the_prompt_queued_on_a_worker_for_little_gain(
        chunk_tokens: int) -> None:
    """Prefill runs in steps of chunk_tokens, first come first served: a request joining a
    worker that is finishing a 2,000-token prompt fills that prompt's last step with its
    own 3,000 tokens, and the prompt's first token comes 0.15 s later. The warmer worker
    is 0.05 s faster for this request alone, so the idle home keeps it; pricing off (0),
    the warmer one takes it."""
    workers = pool(4)
    req = request("doc", tokens=6000)
    policy = PredictedTTFT(chunk_tokens=chunk_tokens)
    home = policy.rank(req, annotate(workers, req, {}, {})).ranked[0].id
    warmer = next(w for w in workers if w.id != home)
    warmer.cost.dispatched(2000, now=0.0, tokens=2000)  # the prompt it is finishing
    decision = policy.rank(req, annotate(workers, req, {warmer.id: 3000}, {warmer.id: 2000}))
    assert decision.ranked[0].id == (home if chunk_tokens else warmer.id)


@pytest.mark.parametrize(("big_tokens", "moves"), [(10_000, True), (16_000, False)])
def test_the_room_a_follower_fills_is_counted_from_the_prompts_sent_not_the_drained_queue(
        big_tokens: int, moves: bool) -> None:
    """Steps are cut from the start of the busy period: after a 10,000-token prompt the
    engine's second step has 6,384 tokens of room, which a 3,000-token follower fills
    (0.15 s later for that prompt), so the follower takes an idle worker; after a
    16,000-token one only 384 are left and it stays warm. The drained queue (7,000 in
    both) would have put the room at 1,192 either way."""
    policy = PredictedTTFT()
    workers = pool(4)
    doc = request("doc", tokens=6000)
    home_id = policy.rank(doc, annotate(workers, doc, {}, {})).ranked[0].id
    home = next(w for w in workers if w.id == home_id)
    for _ in range(2):  # hot: a copy is allowed when it pays
        policy.rank(doc, annotate(workers, doc, {home_id: 3000}, {}))
    home.cost.dispatched(big_tokens, now=0.0, tokens=big_tokens)  # the big prompt, queued
    decision = policy.rank(doc, annotate(workers, doc, {home_id: 3000}, {home_id: 7000}))
    assert (decision.ranked[0].id != home_id) == moves


def test_a_long_prompt_delays_a_queued_one_by_its_first_step_not_its_average_share() -> None:
    """A cold 120 k-token prompt joining a worker that has a 400-token prompt queued fills
    the rest of that prompt's step with its first ~7.8 k tokens: 0.44 s at their own
    position's price. A share of the long prompt's average price (its later tokens attend
    over ~100 k before them) said 1.1 s, past the 5 % slack of a 17 s prediction, and moved
    the prompt off its ring owner for a delay it does not cause (live Mooncake, request 23)."""
    workers = pool(4)
    req = request("long-cold", tokens=120_000.0)

    def candidates(queued: dict[str, float]) -> list[Candidate]:
        out = annotate(workers, req, {}, queued)
        for c in out:
            c.prefill_work = prefill_work(c.uncached_tokens, c.cached_tokens, 32768.0)
            c.ttft_s = (c.queued_tokens + c.prefill_work) / RATE
        return out

    owner = PredictedTTFT().rank(req, candidates({})).ranked[0]
    owner.worker.cost.dispatched(400.0, now=0.0, tokens=400.0)
    decision = PredictedTTFT().rank(req, candidates({owner.id: 400.0}))
    assert decision.ranked[0].id == owner.id and decision.reason == "ring"


@settings(max_examples=200, deadline=None)
@given(new=st.floats(1, 200_000), cached=st.floats(0, 100_000), cut=st.floats(0, 1),
       attention=st.sampled_from([0.0, 8192.0, 32768.0]))
def test_leading_work_is_the_first_tokens_at_their_own_position(
        new: float, cached: float, cut: float, attention: float) -> None:
    n = new * cut
    total = prefill_work(new, cached, attention)
    first = leading_work(n, new, cached, total)
    assert first == pytest.approx(prefill_work(n, cached, attention), rel=1e-9, abs=1e-6)
    rest = prefill_work(new - n, cached + n, attention)
    assert first + rest == pytest.approx(total, rel=1e-9)
    assert first <= total * cut + 1e-6  # never more than its share of the average


def branch(context: str, trunk: int, *links: bytes) -> RoutingRequest:
    """A request of ``context``: a trunk of ``trunk`` links every request shares, then its own."""
    chain = tuple(bytes([1, i]) * 4 for i in range(trunk)) + links
    return RoutingRequest(RoutingKey(context, chain), 64.0 * len(chain) + 300, 64.0)


def test_the_trunk_is_what_every_request_of_a_context_shares() -> None:
    replicas = ReplicaSets()
    first = branch("persona", 10, b"session1")
    assert replicas.trunk_depth("persona", first.key.chain) is None  # nothing seen yet
    replicas.use("persona", "w0", first.key.chain)
    replicas.use("persona", "w0", branch("persona", 10, b"session1", b"step2").key.chain)
    step3 = branch("persona", 10, b"session1", b"step3").key.chain
    assert replicas.trunk_depth("persona", step3) == 11  # one session: all of it so far
    assert replicas.trunk_depth("persona", branch("persona", 10, b"s2").key.chain) == 10
    replicas.use("persona", "w0", branch("persona", 10, b"session2").key.chain)
    assert replicas.trunk_depth("persona", step3) == 10  # a second session: the tool prompt
    assert replicas.trunk_depth("persona", branch("persona", 4).key.chain) == 4


def test_a_context_short_of_its_share_founds_a_replica_where_least_was_placed() -> None:
    """An agent persona's tool prompt keys every step of every session: a new session (a
    branch no worker holds past the trunk) of a persona carrying the fleet's traffic starts
    on the worker placed least lately when its home is busy, while a session's next step
    stays where its history is, and a context with a small share stays home."""
    clock = Clock()
    replicas = ReplicaSets(idle_s=30.0, clock=clock)
    policy = PredictedTTFT(replicas=replicas)
    workers = pool(8)
    trunk = 64.0 * 10  # the tool prompt: 10 links
    first = branch("persona", 10, b"session1")
    home = policy.rank(first, annotate(workers, first, {}, {})).ranked[0].id
    req = branch("persona", 10, b"session2")  # the trunk is learned from two sessions
    assert policy.rank(req, annotate(workers, req, {home: trunk}, {})).ranked[0].id == home
    req = branch("persona", 10, b"session3")
    idle = policy.rank(req, annotate(workers, req, {home: trunk}, {}))
    assert idle.ranked[0].id == home  # an idle home starts it soonest: nothing to balance
    next(w for w in workers if w.id == home).begin()  # home is busy now
    decision = policy.rank(req, annotate(workers, req, {home: trunk}, {}))
    assert decision.reason == "spread" and decision.ranked[0].id != home
    founded = decision.ranked[0].id
    assert set(replicas.live("persona")) == {home, founded}
    # the next new session goes to a third worker: the two placed lately are passed over
    next(w for w in workers if w.id == founded).begin()
    req = branch("persona", 10, b"session4")
    held = {home: trunk, founded: trunk}
    third = policy.rank(req, annotate(workers, req, held, {}))
    assert third.reason == "spread" and third.ranked[0].id not in {home, founded}
    # session 1's next step: its history (11 links) is on home, so it stays there
    step = branch("persona", 10, b"session1", b"step2")
    stays = policy.rank(step, annotate(workers, step, {**held, home: trunk + 64}, {}))
    assert stays.ranked[0].id == home and stays.reason == "warm"
    # a context that carries little of the fleet's traffic keeps its one home
    for i in range(60):
        other = branch(f"doc{i}", 3)
        policy.rank(other, annotate(workers, other, {}, {}))
    assert replicas.wanted("persona", 8) == 1
    req = branch("persona", 10, b"session5")
    late = policy.rank(req, annotate(workers, req, held, {}))
    assert late.reason != "spread" and late.ranked[0].id in held


def _persona_at_its_share(placed_on_w3: int, trunk: int = 10, workers: int = 4,
                          late: dict[str, int] | None = None
                          ) -> tuple[PredictedTTFT, list[Worker]]:
    """A hot persona with three sessions on w0 and one replica wanted (the other contexts carry
    most of the traffic, on w0-w2, ``placed_on_w3`` on w3 and ``late`` elsewhere), its
    home busy."""
    replicas = ReplicaSets(idle_s=30.0, clock=Clock())
    for session in (b"s0", b"s1", b"s2"):  # three within idle_s: hot
        replicas.use("persona", "w0", branch("persona", trunk, session).key.chain)
    for i in range(39):
        replicas.use(f"doc{i}", f"w{i % 3}")
    for worker_id, count in {"w3": placed_on_w3, **(late or {})}.items():
        for i in range(count):
            replicas.use(f"late-{worker_id}-{i}", worker_id)
    assert replicas.wanted("persona", workers) == 1
    fleet = pool(workers)
    fleet[0].begin()
    return PredictedTTFT(replicas=replicas), fleet


def test_a_new_branch_past_its_share_founds_a_replica_only_on_a_worker_placed_under_half(
) -> None:
    """w0 took 15 recent requests: a new session founds on w3 when w3 took none, and stays
    home when w3 took 8 (a worker near the others' count is no imbalance to fix)."""
    req = branch("persona", 10, b"s3")
    held = {"w0": 640.0}
    policy, workers = _persona_at_its_share(placed_on_w3=0)
    founded = policy.rank(req, annotate(workers, req, held, {}))
    assert founded.reason == "spread" and founded.ranked[0].id == "w3"
    policy, workers = _persona_at_its_share(placed_on_w3=8)
    kept = policy.rank(req, annotate(workers, req, held, {}))
    assert kept.reason != "spread" and kept.ranked[0].id == "w0"


@pytest.mark.parametrize(("steps", "on_w1", "others", "expected"), [
    (3, 1, 0, ("w1", "spread")),  # w0 took 18 of 21 recent requests: over the mean, w1 under
    (3, 4, 0, ("w0", "warm")),  # w1 took 12 of 30: over the mean too, nothing to fix
    (3, 1, 20, ("w1", "spread")),  # w0 under the cap of a busier fleet, w1 under its floor
    (3, 5, 20, ("w0", "warm")),  # w0 and w1 both within epsilon of that fleet's mean
    (1, 1, 0, ("w0", "warm")),  # a document's questions: one request a branch
])
def test_a_new_branch_takes_a_replica_under_the_fleets_mean_from_one_over_it(
        steps: int, on_w1: int, others: int, expected: tuple[str, str]) -> None:
    """An agent persona's sessions went six to w0 and one to w1 (a replica founded late),
    each followed by later steps: the next session starts on w1, though w0 is idle and
    predicted 10 ms sooner, while w0 took more than ``epsilon`` over the fleet's mean of
    recent requests and w1 did not, or w1 took less than ``epsilon`` under it and w0 did
    not (live agentic: a late replica started 2 sessions while the others started 16,
    and one under half the mean none while one at the mean took six). A document whose
    questions come one a branch stays on the soonest: moving it would buy nothing later."""
    replicas = ReplicaSets(idle_s=30.0, clock=Clock())
    for worker_id in ("w2", "w3"):  # other contexts' requests on the rest of the fleet
        for i in range(others):
            replicas.use(f"doc-{worker_id}-{i}", worker_id)
    for session, worker_id in enumerate(["w0"] * 6 + ["w1"] * on_w1):
        if session:
            replicas.branched("persona")  # what the policy records on each new branch
        for step in range(steps):
            req = branch("persona", 10, b"s%d" % session, *(b"step",) * step)
            replicas.use("persona", worker_id, req.key.chain)
    policy, workers = PredictedTTFT(replicas=replicas), pool(4)
    req = branch("persona", 10, b"next")
    decision = policy.rank(req, annotate(workers, req, {"w0": 640.0, "w1": 640.0},
                                         {"w1": 0.01 * RATE}))
    assert (decision.ranked[0].id, decision.reason) == expected


def test_a_new_branch_founds_no_replica_behind_a_long_queue() -> None:
    """w3 took no request lately but holds one long prompt in prefill (2 s of it): the
    new session founds on w4, which took two, rather than wait behind it."""
    req = branch("persona", 10, b"s3")
    policy, workers = _persona_at_its_share(placed_on_w3=0, workers=5, late={"w4": 2})
    founded = policy.rank(req, annotate(workers, req, {"w0": 640.0}, {"w3": 2 * RATE}))
    assert founded.reason == "spread" and founded.ranked[0].id == "w4"


def test_a_turn_whose_trunk_outgrows_one_prefill_step_keeps_its_home() -> None:
    """A conversation's turns share its whole history: past one prefill step (8,192 tokens)
    that trunk is not a prompt many sessions share, and copying it to balance the fleet
    costs the turn more than waiting at home (live Mooncake: 4.35 s against 99 ms)."""
    for links, kept in ((200, True), (100, False)):  # 12,800 tokens of history; 6,400
        policy, workers = _persona_at_its_share(placed_on_w3=0, trunk=links)
        for turn in (b"turn0", b"turn1", b"turn2"):
            policy.replicas.use("chat", "w0", branch("chat", links, turn).key.chain)
        req = branch("chat", links, b"turn3")
        decision = policy.rank(req, annotate(workers, req, {"w0": 64.0 * links}, {}))
        if kept:
            assert decision.reason != "spread" and decision.ranked[0].id == "w0"
        else:  # one step copies it
            assert decision.reason == "spread" and decision.ranked[0].id == "w3"


def test_a_context_at_its_share_that_is_not_hot_keeps_its_home() -> None:
    """Two requests of a context within half a minute are a conversation's turns or a
    document's few questions, not a persona's sessions: at its share, its new branch stays
    home even where another worker took fewer requests."""
    policy, workers = _persona_at_its_share(placed_on_w3=0)
    for question in (b"q1", b"q2"):
        policy.replicas.use("doc", "w0", branch("doc", 10, question).key.chain)
    req = branch("doc", 10, b"q3")
    kept = policy.rank(req, annotate(workers, req, {"w0": 640.0}, {}))
    assert kept.reason != "spread" and kept.ranked[0].id == "w0"
    req = branch("doc", 10, b"q4")  # q3 was the third within idle_s: hot now
    founded = policy.rank(req, annotate(workers, req, {"w0": 640.0}, {}))
    assert founded.reason == "spread" and founded.ranked[0].id == "w3"


def test_a_warm_worker_a_few_ms_slower_than_a_cold_owner_keeps_the_context() -> None:
    """A stale queue shared by another router replica makes the warm worker look 20 ms
    slower than the key's ring owner, which holds nothing: the context stays where it is
    warm rather than gain a second copy; 100 ms slower is past the slack."""
    workers = pool(4)
    req = request("doc", tokens=1000)
    owner = PredictedTTFT().rank(req, annotate(workers, req, {}, {})).ranked[0].id
    warm = next(w.id for w in workers if w.id != owner)
    held = {warm: 900.0}  # cost: 100 uncached tokens (5 ms) + the phantom queue

    def placed(phantom_tokens: float) -> str:
        candidates = annotate(workers, req, held, {warm: phantom_tokens})
        return PredictedTTFT().rank(req, candidates).ranked[0].id

    assert placed(1300.0) == warm  # 70 ms against the owner's 50: within the slack
    assert placed(3000.0) == owner  # 155 ms against 50



def test_a_new_context_skips_a_ring_owner_with_more_than_its_share_of_recent_work() -> None:
    """At low load no worker nears the in-flight bound, so new contexts followed the ring
    alone and its arcs set the balance (offline multiturn: max/mean busy 1.25-1.46). A new
    context starts on the first worker clockwise whose recent prefill work is within
    ``epsilon`` of the fleet's mean; its later requests follow it there."""
    clock = Clock()
    replicas = ReplicaSets(idle_s=30.0, clock=clock)
    policy = PredictedTTFT(replicas=replicas)
    workers = pool(4)

    def owned_by(worker_id: str, tag: str) -> RoutingRequest:
        for i in range(1000):
            req = request(f"{tag}{i}")  # a fresh policy has no recent work: the ring alone
            if PredictedTTFT().rank(req, annotate(workers, req, {}, {})).ranked[0].id \
                    == worker_id:
                return req
        raise AssertionError("no key owned by " + worker_id)

    for w in workers:  # 4,000 tokens placed on every worker lately
        replicas.use(f"old-{w.id}", w.id, (), 4000.0)
    replicas.use("long-prompt", "w0", (), 40_000.0)  # and a long prompt on w0
    mine, other = owned_by("w0", "a"), owned_by("w1", "b")
    moved = policy.rank(mine, annotate(workers, mine, {}, {}))
    assert moved.reason == "spill" and moved.ranked[0].id != "w0"
    assert policy.rank(mine, annotate(workers, mine, {}, {})).ranked[0].id == \
        moved.ranked[0].id  # its home now
    kept = policy.rank(other, annotate(workers, other, {}, {}))
    assert kept.reason == "ring" and kept.ranked[0].id == "w1"
    clock.now = 300.0  # ten idle_s later the work has faded: the ring decides again
    late = owned_by("w0", "c")
    assert policy.rank(late, annotate(workers, late, {}, {})).ranked[0].id == "w0"


def test_a_short_opener_one_worker_holds_draws_only_the_first_new_context() -> None:
    """A chat's system prompt (256 tokens) is held by one worker before the fleet has seen
    it twice: each new conversation matched it there and went warm, 13 of the first 30 to
    one of 8 workers (offline multiturn seed 4). Once more than one worker's share of the
    new contexts start from it, it is an opener, not a context, and each goes to its own
    ring owner. A short prefix few new contexts start from (a snippet some questions
    share), or a long one (a 3,000-token document), still draws them to its holder."""
    workers = pool(8)
    ring = PredictedTTFT()

    def placed(policy: PredictedTTFT, context: str, opener_tokens: int,
               opener: str = "opener") -> tuple[str, str, str]:
        req = request(context, opener_tokens + 200, opener_tokens // 64, opener)
        owner = ring.rank(req, annotate(workers, req, {}, {})).ranked[0].id
        holder = "w0" if owner != "w0" else "w1"
        decision = policy.rank(req, annotate(workers, req, {holder: opener_tokens}, {}))
        return decision.ranked[0].id, holder, owner

    chats = PredictedTTFT()
    chosen, holder, _ = placed(chats, "chat-1", 256)
    assert chosen == holder  # the first: nothing says the prefix is not its own
    for context in ("chat-2", "chat-3", "chat-4"):
        chosen, holder, owner = placed(chats, context, 256)
        assert chosen == owner != holder
    for context in ("rag-1", "rag-2", "rag-3"):
        chosen, holder, _ = placed(chats, context, 3008, "doc")  # 150 ms of prefill
        assert chosen == holder

    snippets = PredictedTTFT()
    for i in range(16):  # new contexts that start from nothing held
        req = request(f"other-{i}")
        snippets.rank(req, annotate(workers, req, {}, {}))
    for context in ("q-1", "q-2", "q-3"):  # then 3 of 19 start from one snippet
        chosen, holder, _ = placed(snippets, context, 256, "snippet")
        assert chosen == holder
