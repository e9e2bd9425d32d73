"""Consistent hashing with bounded loads, corrected by residency (DESIGN.md, "prefix_aware").

bound = ceil((1 + epsilon) * (total load + 1) / n)  (Mirrokni, Thorup, Zadimoghaddam).
Among workers under the bound the longest resident prefix wins (ties in ring order); with
no useful match the key's ring owner takes it, or the next ring node under the bound (a
spill, which makes a hot prefix's second warm replica). Some worker is always under the
bound, so a request is never sent over it while another could take it. The ring is walked
lazily: a decision touches a few ring nodes, not the whole fleet.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from itertools import islice

from router.keys import RoutingKey
from router.policies.base import Decision
from router.policies.ring import RingCache
from router.workers import Worker


def load_bound(total_load: int, n: int, epsilon: float) -> int:
    return math.ceil((1 + epsilon) * (total_load + 1) / n)


class PrefixAware:
    name = "prefix_aware"
    uses_residency = True

    def __init__(self, epsilon: float = 0.25, min_match: int = 1, depth: int = 4) -> None:
        self.epsilon = epsilon
        self.min_match = min_match
        self.depth = depth  # ranked-list length: the choice plus its failovers
        self._rings = RingCache()

    def rank(self, key: RoutingKey, candidates: Sequence[Worker],
             matches: Mapping[str, int]) -> Decision:
        bound = load_bound(sum(w.load for w in candidates), len(candidates), self.epsilon)
        warm = [w for w in candidates
                if matches.get(w.id, 0) >= self.min_match and w.load + 1 <= bound]
        seen: list[Worker] = []
        if warm:
            longest = max(matches[w.id] for w in warm)
            tied = {w.id for w in warm if matches[w.id] == longest}
            # break ties on the ring from the shared block itself, not from this request's
            # key: every request sharing that prefix then prefers the same warm replica
            walk = self._rings.walk(key.chain[min(longest, len(key.chain)) - 1].hex(), candidates)
            for worker in walk:  # the first tied worker in ring order wins
                seen.append(worker)
                if worker.id in tied:
                    choice, reason = worker, "warm"
                    break
        else:
            walk = self._rings.walk(key.key, candidates)
            for worker in walk:
                seen.append(worker)
                if worker.load + 1 <= bound:
                    choice = worker
                    reason = "ring" if worker is seen[0] else "spill"
                    break
        rest = [w for w in seen if w is not choice]
        rest.extend(islice(walk, max(0, self.depth - 1 - len(rest))))
        rest.sort(key=lambda w: w.load + 1 > bound)  # failover to workers under the bound first
        return Decision([choice, *rest[: self.depth - 1]], reason)
