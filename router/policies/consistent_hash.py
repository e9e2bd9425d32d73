"""Plain consistent hashing on the routing key: affinity without a load bound."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from router.keys import RoutingKey
from router.policies.base import Decision
from router.policies.ring import RingCache
from router.workers import Worker


class ConsistentHash:
    name = "consistent_hash"
    uses_residency = False

    def __init__(self) -> None:
        self._rings = RingCache()

    def rank(self, key: RoutingKey, candidates: Sequence[Worker],
             matches: Mapping[str, int]) -> Decision:
        return Decision(list(self._rings.walk(key.key, candidates)), "ring")
