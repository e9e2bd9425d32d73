"""Routing policies, one module each, behind ``router.policies.base.Policy``."""

from __future__ import annotations

from router.policies.base import Decision, Policy
from router.policies.consistent_hash import ConsistentHash
from router.policies.least_loaded import LeastLoaded
from router.policies.prefix_aware import PrefixAware
from router.policies.round_robin import RoundRobin

POLICY_NAMES = ("prefix_aware", "consistent_hash", "least_loaded", "round_robin")


def make_policy(name: str, *, epsilon: float = 0.25, min_match: int = 1,
                warm_ratio: float = 0.5) -> Policy:
    if name == "prefix_aware":
        return PrefixAware(epsilon=epsilon, min_match=min_match, warm_ratio=warm_ratio)
    if name == "consistent_hash":
        return ConsistentHash()
    if name == "least_loaded":
        return LeastLoaded()
    if name == "round_robin":
        return RoundRobin()
    raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICY_NAMES)}")


__all__ = ["POLICY_NAMES", "Decision", "Policy", "make_policy"]
