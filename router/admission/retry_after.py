"""How long until the fleet could start a request: the drain time of the work ahead of it.

Work ahead = the engines' prefill backlog beyond what they are allowed to hold
(``engine_queue_s`` on the least busy worker) plus the router's queue ahead of the
request, in uncached prompt tokens, at the fleet's learned prefill rate (the sum of its
workers' lines). That is what a client told to retry should wait: not a constant.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Capacity:
    """One model's fleet at one instant, as admission sees it."""

    ready: bool  # some worker can take a request now
    backlog_s: float  # until the least busy worker is back under its allowance
    rate: float  # fleet prefill tokens/s (0: no worker)


def drain_seconds(capacity: Capacity, ahead_tokens: float) -> float:
    if capacity.rate <= 0:
        return float("inf")
    return capacity.backlog_s + ahead_tokens / capacity.rate
