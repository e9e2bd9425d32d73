"""Properties of the routing policies (hypothesis), checked on the policy objects directly."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from router.fleet.workers import Worker
from router.routing.candidate import Candidate
from router.routing.keys import RoutingKey
from router.routing.policies import POLICY_NAMES, Decision, Policy, PolicyKnobs, make_policy
from router.routing.policies.bound import load_bound
from router.routing.request import RoutingRequest


def workers(loads: Sequence[int]) -> list[Worker]:
    return [Worker(id=f"w{i}", url=f"http://w{i}", in_flight=load, healthy=True)
            for i, load in enumerate(loads)]


def key(i: int) -> RoutingKey:
    return RoutingKey(f"{i:016x}", (i.to_bytes(8, "big"),))


def rank(policy: Policy, k: RoutingKey, pool: Sequence[Worker],
         matches: dict[str, int] | None = None) -> Decision:
    """Candidates annotated by hand with their residency matches, ranked."""
    found = matches or {}
    candidates = [Candidate(w, matched_blocks=found.get(w.id, 0)) for w in pool]
    return policy.rank(RoutingRequest(k, 64.0 * len(k.chain), 64.0), candidates)


def ids(decision: Decision) -> list[str]:
    return [c.id for c in decision.ranked]


loads_st = st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=12)


@settings(max_examples=300, deadline=None)
@given(loads=loads_st, k=st.integers(min_value=0, max_value=10**9),
       matched=st.dictionaries(st.integers(0, 11), st.integers(1, 64)),
       epsilon=st.sampled_from([0.05, 0.25, 1.0]))
def test_prefix_aware_never_exceeds_the_bound_while_a_worker_is_under_it(
        loads: list[int], k: int, matched: dict[int, int], epsilon: float) -> None:
    pool = workers(loads)
    matches = {f"w{i}": m for i, m in matched.items() if i < len(pool)}
    policy = make_policy("prefix_aware", PolicyKnobs(epsilon=epsilon))
    decision = rank(policy, key(k), pool, matches)
    bound = load_bound(sum(loads), len(loads), epsilon)
    assert any(w.load + 1 <= bound for w in pool)  # the averaging argument: always true
    assert decision.ranked[0].load + 1 <= bound
    # and the warm choice, when taken, is the longest match under the bound
    under = [w for w in pool if w.load + 1 <= bound]
    if decision.reason == "warm":
        assert matches[decision.ranked[0].id] == max(matches.get(w.id, 0) for w in under)


@settings(max_examples=100, deadline=None)
@given(n=st.integers(min_value=2, max_value=10), k=st.integers(min_value=0, max_value=10**9))
def test_same_key_goes_to_the_same_worker_while_loads_allow(n: int, k: int) -> None:
    policy = make_policy("prefix_aware")
    pool = workers([0] * n)
    first = rank(policy, key(k), pool, {}).ranked[0].worker
    assert rank(policy, key(k), pool, {}).reason == "ring"
    # load every other worker up: the owner is still under the bound and keeps the key
    for w in pool:
        if w is not first:
            w.in_flight = 3
    again = rank(policy, key(k), pool, {})
    assert again.ranked[0].worker is first and again.reason == "ring"
    # push the owner over the bound: the key spills to the next ring node
    first.in_flight = 100
    spilled = rank(policy, key(k), pool, {})
    assert spilled.ranked[0].worker is not first and spilled.reason == "spill"


def test_removing_one_of_n_workers_moves_only_the_keys_it_owned() -> None:
    n, keys = 8, [key(i) for i in range(10_000)]
    policy = make_policy("prefix_aware")
    pool = workers([0] * n)
    before = {k.key: rank(policy, k, pool, {}).ranked[0].id for k in keys}
    removed = "w3"
    after = {k.key: rank(policy, k, [w for w in pool if w.id != removed], {}).ranked[0].id
             for k in keys}
    moved = [k for k in before if before[k] != after[k]]
    assert all(before[k] == removed for k in moved)  # only the removed worker's keys move
    owned = sum(1 for k in before if before[k] == removed)
    assert len(moved) == owned
    assert abs(len(moved) / len(keys) - 1 / n) < 0.05  # ~1/n of keys, uhashring's spread


@settings(max_examples=100, deadline=None)
@given(loads=loads_st, k=st.integers(min_value=0, max_value=10**9))
def test_every_policy_ranks_each_candidate_at_most_once(loads: list[int], k: int) -> None:
    pool = workers(loads)
    for name in POLICY_NAMES:
        ranked = rank(make_policy(name), key(k), pool).ranked
        assert len({w.id for w in ranked}) == len(ranked) and ranked
        assert {c.worker for c in ranked} <= set(pool)
    ranked = rank(make_policy("least_loaded"), key(k), pool).ranked
    assert ranked[0].load == min(loads)


def test_bound_formula_matches_the_paper() -> None:
    assert load_bound(0, 4, 0.25) == 1
    assert load_bound(15, 4, 0.25) == math.ceil(1.25 * 16 / 4)


@settings(max_examples=100, deadline=None)
@given(n=st.integers(min_value=2, max_value=10), a=st.integers(0, 10**9),
       b=st.integers(0, 10**9), warm=st.sets(st.integers(0, 9), min_size=2))
def test_equally_warm_replicas_are_preferred_the_same_way_by_every_request(
        n: int, a: int, b: int, warm: set[int]) -> None:
    """Two requests sharing a prefix (but not their ring keys) pick the same warm replica."""
    pool = workers([0] * n)
    shared = tuple(bytes([i]) * 8 for i in range(4))
    first = RoutingKey(key=f"{a:x}", chain=(*shared, b"\x01" * 8))
    second = RoutingKey(key=f"{b:x}", chain=(*shared, b"\x02" * 8))
    matches = {f"w{i}": len(shared) for i in warm if i < n}
    if not 2 <= len(matches) < n:  # all equally warm: nothing to prefer, the ring decides
        return
    policy = make_policy("prefix_aware")
    one, two = rank(policy, first, pool, matches), rank(policy, second, pool, matches)
    assert one.reason == two.reason == "warm"
    assert one.ranked[0].id == two.ranked[0].id


async def test_a_shared_system_prompt_does_not_make_every_busy_worker_warm() -> None:
    """New documents behind one system prompt spread over the ring, even one at a time."""
    from router.residency.memory import MemoryResidency
    from router.routing.keys import prompt_key

    policy, residency, pool = make_policy("prefix_aware"), MemoryResidency(), workers([0] * 4)
    system = "You answer from the documents. " * 30  # ~4 blocks every prompt shares
    chosen = []
    for doc in range(40):
        prompt = (system + f"document {doc} " * 400 + "question?").encode()
        k = prompt_key(prompt, "m", block_size=256, max_blocks=256, key_blocks=32)
        matches = await residency.match(k.chain, [w.id for w in pool])
        decision = rank(policy, k, pool, matches)
        assert decision.reason == "ring"  # only the system prompt is resident anywhere
        residency.record(decision.ranked[0].id, k.chain)
        await asyncio.sleep(0)  # let the batched record land
        chosen.append(decision.ranked[0].id)
    assert set(chosen) == {"w0", "w1", "w2", "w3"}
    # and a repeat of a document is warm where it went first
    prompt = (system + "document 7 " * 400 + "another question?").encode()
    k = prompt_key(prompt, "m", block_size=256, max_blocks=256, key_blocks=32)
    decision = rank(policy, k, pool, await residency.match(k.chain, [w.id for w in pool]))
    assert decision.ranked[0].id == chosen[7]


def test_a_prefix_every_worker_holds_is_not_warm_even_in_a_short_prompt() -> None:
    """A conversation opener all workers hold covers most of a short prompt: still the ring."""
    pool = workers([0] * 4)
    chain = tuple(bytes([i]) * 8 for i in range(4))  # 3 opener blocks + 1 new block
    key = RoutingKey(key="feedface", chain=chain)
    policy = make_policy("prefix_aware")
    everyone = {w.id: 3 for w in pool}
    assert rank(policy, key, pool, everyone).reason == "ring"
    # one worker holding more than the rest (the new block too) is warm
    assert rank(policy, key, pool, {**everyone, "w2": 4}).ranked[0].id == "w2"
