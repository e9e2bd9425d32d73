"""Least-loaded: perfect balance, no cache affinity."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from router.keys import RoutingKey
from router.policies.base import Decision
from router.workers import Worker


class LeastLoaded:
    name = "least_loaded"
    uses_residency = False

    def __init__(self) -> None:
        self._tiebreak = 0

    def rank(self, key: RoutingKey, candidates: Sequence[Worker],
             matches: Mapping[str, int]) -> Decision:
        # rotate before sorting so equal loads do not all land on the first worker
        self._tiebreak += 1
        start = self._tiebreak % len(candidates)
        rotated = [*candidates[start:], *candidates[:start]]
        return Decision(sorted(rotated, key=lambda w: w.load), "least_loaded")
