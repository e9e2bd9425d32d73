"""The one interface every routing policy implements."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from router.keys import RoutingKey
from router.workers import Worker


@dataclass(frozen=True, slots=True)
class Decision:
    """``ranked[0]`` is the choice, the rest the failover order; ``reason`` is for metrics."""

    ranked: list[Worker]
    reason: str


class Policy(Protocol):
    name: str
    #: whether ``rank`` reads residency matches (the caller skips the lookup otherwise)
    uses_residency: bool

    def rank(self, key: RoutingKey, candidates: Sequence[Worker],
             matches: Mapping[str, int]) -> Decision:
        """Order candidates (non-empty, all routable) for this request."""
        ...
