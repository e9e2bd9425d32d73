"""Plain consistent hashing on the routing key: affinity without a load bound."""

from __future__ import annotations

from collections.abc import Sequence

from router.routing.candidate import Candidate
from router.routing.policies.base import Decision
from router.routing.policies.ring import RingCache
from router.routing.request import RoutingRequest


class ConsistentHash:
    name = "consistent_hash"
    needs: tuple[str, ...] = ()
    shortlists = False

    def __init__(self) -> None:
        self._rings = RingCache()

    def rank(self, request: RoutingRequest, candidates: Sequence[Candidate]) -> Decision:
        return Decision(list(self._rings.walk(request.key.key, candidates)), "ring")
