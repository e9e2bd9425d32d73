"""The lazy ring walk visits workers in exactly uhashring's ``iterate_nodes`` order."""

from __future__ import annotations

import random

from uhashring import HashRing

from router.fleet.workers import Worker
from router.routing.policies.ring import RingCache


def test_walk_is_uhashring_order() -> None:
    rng = random.Random(7)
    for n in (1, 2, 3, 17):
        workers = [Worker(id=f"w{i}", url="http://w") for i in range(n)]
        ring, rings = HashRing(nodes=sorted(w.id for w in workers)), RingCache()
        for _ in range(100):
            key = rng.randbytes(8).hex()
            walked = [w.id for w in rings.walk(key, workers)]
            assert walked == list(ring.iterate_nodes(key, distinct=True))
            # a key walked again reads its kept head, then walks on past it
            assert [w.id for w in rings.walk(key, workers)] == walked


def test_a_large_ring_walks_in_uhashring_order() -> None:
    """At fleet scale the walk reads flat arrays of the points' top 64 bits."""
    rng = random.Random(11)
    ids = frozenset(f"worker-{i}" for i in range(300))
    ring, rings = HashRing(nodes=sorted(ids)), RingCache()
    for _ in range(50):
        key = rng.randbytes(8).hex()
        expected = list(ring.iterate_nodes(key, distinct=True))
        assert list(rings.walk_ids(key, ids)) == expected
        assert [w for w, _ in zip(rings.walk_ids(key, ids), range(12), strict=False)] \
            == expected[:12]


def test_rings_merged_from_kept_node_points_follow_membership_changes() -> None:
    """Workers join and leave; a ring built from the points kept per node (and the node
    numbers of forgotten workers reused) walks as a fresh uhashring ring does."""
    rng = random.Random(5)
    rings = RingCache(size=2)
    members = {f"w{i}" for i in range(12)}
    joined = 12
    for _ in range(25):
        if rng.random() < 0.5 and len(members) > 2:
            members.discard(rng.choice(sorted(members)))
        else:
            members.add(f"w{joined}")
            joined += 1
        ids = frozenset(members)
        fresh = HashRing(nodes=sorted(ids))
        for _ in range(5):
            key = rng.randbytes(8).hex()
            assert list(rings.walk_ids(key, ids)) == list(fresh.iterate_nodes(key, distinct=True))
