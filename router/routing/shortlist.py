"""Which workers of a large fleet one decision looks at: those that can matter.

A decision annotates and ranks its candidates one at a time, so its cost grows with their
number: at 1,000 workers one pass over all of them costs more than the rest of the
request. Few of them can win:
- the workers that hold some of the prompt warm (the residency store finds them without
  probing the others; when more hold it than the shortlist's size, the deepest matches);
- the context's home: its ring nodes from the key up to the first at or under the
  fleet's mean load (which the bounded-load guard always admits), so the ring owner the
  policy picks is the whole fleet's (its other replicas hold its prompt: the first case);
- the least loaded, sampled: ``sample`` workers in a row of the fleet's list from a
  random start (the power of d choices: the least loaded of d random workers is close
  to the least loaded of all; a run from a random start draws as well where the list's
  order says nothing of load, and costs one slice instead of d draws).
Fleets of at most ``size`` workers, and policies that read every candidate (round robin,
least loaded, the peers' reproductions), get every routable worker, as before.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Awaitable, Callable

from router.fleet.view import FleetView
from router.routing.candidate import Candidate
from router.routing.policies.ring import RingCache
from router.routing.request import RoutingRequest

Match = Callable[[RoutingRequest, frozenset[str]], Awaitable[dict[str, int]]]


class Shortlist:
    def __init__(self, size: int = 64, ring_depth: int = 4, sample: int = 8,
                 seed: int = 0, rings: RingCache | None = None) -> None:
        """``rings``: the policy's own, so that the two walks of one decision are one."""
        self.size = size
        self.ring_depth = ring_depth
        self.sample = sample
        self._rings = rings if rings is not None else RingCache()
        self._rng = random.Random(seed)  # a fixed draw per router: decisions reproduce

    def applies(self, fleet: FleetView) -> bool:
        return len(fleet) > self.size

    async def select(self, request: RoutingRequest, fleet: FleetView,
                     match: Match | None) -> list[Candidate]:
        """``match``: residency over the fleet, one lookup (None: the policy reads none)."""
        picked: dict[str, Candidate] = {}
        by_id = fleet.by_id
        if match is not None and request.key.chain:
            matches = await match(request, fleet.ids)
            request.matches = matches
            holders = matches if len(matches) <= self.size else \
                heapq.nlargest(self.size, matches, key=matches.__getitem__)
            for worker_id in holders:
                worker = by_id.get(worker_id)
                if worker is not None and worker.routable():
                    picked[worker_id] = Candidate(worker)
        n, total = len(fleet), fleet.load()
        routable, under_mean = 0, False
        for worker_id in self._rings.walk_ids(request.key.key, fleet.ids):
            worker = by_id[worker_id]
            if not worker.routable():
                continue
            if worker_id not in picked:
                picked[worker_id] = Candidate(worker)
            routable += 1
            under_mean = under_mean or worker.load * n <= total
            if routable >= self.ring_depth and under_mean:
                break
        start, workers = self._rng.randrange(n), fleet.workers
        for worker in workers[start:start + self.sample] \
                + workers[:max(0, start + self.sample - n)]:
            if worker.id not in picked and worker.routable():
                picked[worker.id] = Candidate(worker)
        request.fleet = fleet
        return list(picked.values())
