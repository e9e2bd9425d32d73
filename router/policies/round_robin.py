"""Round-robin: the baseline that scatters every document over every worker."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from router.keys import RoutingKey
from router.policies.base import Decision
from router.workers import Worker


class RoundRobin:
    name = "round_robin"
    uses_residency = False

    def __init__(self) -> None:
        self._next = 0

    def rank(self, key: RoutingKey, candidates: Sequence[Worker],
             matches: Mapping[str, int]) -> Decision:
        start = self._next % len(candidates)
        self._next += 1
        return Decision([*candidates[start:], *candidates[:start]], "round_robin")
