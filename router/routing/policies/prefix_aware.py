"""The first rule, kept for comparison: bounded-load consistent hashing, corrected by residency.

bound = ceil((1 + epsilon) * (total load + 1) / n)  (Mirrokni, Thorup, Zadimoghaddam).
By default the key's ring owner takes the request, or the next ring node under the bound
(a spill, which makes a hot context's second warm replica). Residency overrides the ring
only for a *significant* match: a worker under the bound that holds at least
``warm_ratio`` of this prompt's blocks (and ``min_match``), and more than every candidate
holds. A shorter match, or one every worker shares, is a system prompt or a conversation
opener; letting it win would pile new contexts onto a few workers and leave others cold.
Among significant matches the longest wins, ties broken on the ring from the shared block
itself, so every request sharing that prefix prefers the same replica. Some worker is
always under the bound, so no request goes over it while another could take it. The ring
is walked lazily.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import islice

from router.routing.candidate import Candidate
from router.routing.policies.base import Decision
from router.routing.policies.bound import load_bound
from router.routing.policies.ring import RingCache
from router.routing.request import RoutingRequest


class PrefixAware:
    name = "prefix_aware"
    needs: tuple[str, ...] = ("residency",)
    shortlists = False

    def __init__(self, epsilon: float = 0.25, min_match: int = 1, warm_ratio: float = 0.5,
                 depth: int = 4) -> None:
        self.epsilon = epsilon
        self.min_match = min_match
        self.warm_ratio = warm_ratio
        self.depth = depth  # ranked-list length: the choice plus its failovers
        self._rings = RingCache()

    def rank(self, request: RoutingRequest, candidates: Sequence[Candidate]) -> Decision:
        key = request.key
        matches = {c.id: c.matched_blocks for c in candidates if c.matched_blocks}
        bound = load_bound(sum(w.load for w in candidates), len(candidates), self.epsilon)
        significant = max(self.min_match, math.ceil(self.warm_ratio * len(key.chain)))
        # what every candidate holds (a system prompt, a conversation opener) says nothing
        # about where this context lives: only a match beyond it can override the ring
        common = min(matches.get(w.id, 0) for w in candidates) if len(candidates) > 1 else 0
        warm = [w for w in candidates if w.load + 1 <= bound
                and matches.get(w.id, 0) >= significant and matches[w.id] > common]
        seen: list[Candidate] = []
        if warm:
            longest = max(matches[w.id] for w in warm)
            tied = {w.id for w in warm if matches[w.id] == longest}
            walk = self._rings.walk(key.chain[min(longest, len(key.chain)) - 1].hex(),
                                    candidates)
            for worker in walk:
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
