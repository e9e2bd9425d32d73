"""Round-robin: the baseline that scatters every document over every worker."""

from __future__ import annotations

from collections.abc import Sequence

from router.routing.candidate import Candidate
from router.routing.policies.base import Decision
from router.routing.request import RoutingRequest


class RoundRobin:
    name = "round_robin"
    needs: tuple[str, ...] = ()
    shortlists = False

    def __init__(self) -> None:
        self._next = 0

    def rank(self, request: RoutingRequest, candidates: Sequence[Candidate]) -> Decision:
        start = self._next % len(candidates)
        self._next += 1
        return Decision([*candidates[start:], *candidates[:start]], "round_robin")
