"""The bounded-load guard (Mirrokni, Thorup, Zadimoghaddam, "Consistent Hashing with
Bounded Loads"): no worker takes more than (1 + epsilon) times the mean, plus a margin."""

from __future__ import annotations

import math
from collections.abc import Sequence

from router.fleet.view import FleetView
from router.routing.candidate import Candidate


def load_bound(total_load: int, n: int, epsilon: float, margin: int = 0) -> int:
    """``margin`` requests on top, so that at low concurrency (a bound of 1 or 2) a
    conversation's next turn is not pushed off the worker that holds its history."""
    return math.ceil((1 + epsilon) * (total_load + 1) / n) + margin


def under_bound(candidates: Sequence[Candidate], epsilon: float, margin: int = 0,
                fleet: FleetView | None = None) -> list[Candidate]:
    """Candidates that may take one more request; never empty (the least loaded is).
    ``fleet``: the whole fleet when the candidates are a shortlist of it: the bound is the
    fleet's (its running load total), and a shortlist always holds a worker at or under
    the fleet's mean load (router/routing/shortlist.py), which is under the bound."""
    if fleet is None:
        bound = load_bound(sum(c.load for c in candidates), len(candidates), epsilon, margin)
    else:
        bound = load_bound(fleet.load(), len(fleet), epsilon, margin)
    eligible = [c for c in candidates if c.load + 1 <= bound]
    return eligible or [min(candidates, key=lambda c: c.load)]
