"""Least-loaded: perfect balance, no cache affinity."""

from __future__ import annotations

from collections.abc import Sequence

from router.routing.candidate import Candidate
from router.routing.policies.base import Decision
from router.routing.request import RoutingRequest


class LeastLoaded:
    name = "least_loaded"
    needs: tuple[str, ...] = ()
    shortlists = False

    def __init__(self) -> None:
        self._tiebreak = 0

    def rank(self, request: RoutingRequest, candidates: Sequence[Candidate]) -> Decision:
        # rotate before sorting so equal loads do not all land on the first worker
        self._tiebreak += 1
        start = self._tiebreak % len(candidates)
        rotated = [*candidates[start:], *candidates[:start]]
        return Decision(sorted(rotated, key=lambda w: w.load), "least_loaded")
