"""The one interface every routing policy implements."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from router.routing.candidate import Candidate
from router.routing.request import RoutingRequest


@dataclass(frozen=True, slots=True)
class Decision:
    """``ranked[0]`` is the choice, the rest the failover order; ``reason`` is for metrics."""

    ranked: list[Candidate]
    reason: str
    replicas: int = 0  # live replicas of the request's context, where the policy keeps them


class Policy(Protocol):
    name: str
    #: the signals ``rank`` reads (router/routing/signals); the pipeline runs only these
    needs: tuple[str, ...]
    #: ranks a shortlist of a large fleet right (router/routing/shortlist.py): reads the
    #: fleet's load and ring from the request, not only the candidates it is given
    shortlists: bool

    def rank(self, request: RoutingRequest, candidates: Sequence[Candidate]) -> Decision:
        """Order candidates (non-empty, all routable, annotated) for this request."""
        ...
