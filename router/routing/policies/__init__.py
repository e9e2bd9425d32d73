"""Routing policies, one module each, behind ``router.routing.policies.base.Policy``."""

from __future__ import annotations

from dataclasses import dataclass

from router.config import POLICY_NAMES
from router.routing.policies.base import Decision, Policy
from router.routing.policies.consistent_hash import ConsistentHash
from router.routing.policies.least_loaded import LeastLoaded
from router.routing.policies.llmd_weighted import LlmdWeighted
from router.routing.policies.predicted_ttft import PredictedTTFT
from router.routing.policies.prefix_aware import PrefixAware
from router.routing.policies.round_robin import RoundRobin
from router.routing.replicas import ReplicaSets


@dataclass(frozen=True, slots=True)
class PolicyKnobs:
    """The tunables of every policy, filled from RouterConfig by the app."""

    epsilon: float = 0.25
    margin: int = 4
    slack_s: float = 0.05
    slack_ratio: float = 0.25
    cold_slack_s: float = 0.01
    replicate_cost: float = 1.0
    replica_idle_s: float = 30.0
    hot_requests: int = 3
    min_match: int = 1
    warm_ratio: float = 0.5


def make_policy(name: str, knobs: PolicyKnobs | None = None) -> Policy:
    k = knobs or PolicyKnobs()
    if name == "predicted_ttft":
        return PredictedTTFT(epsilon=k.epsilon, margin=k.margin, slack_s=k.slack_s,
                             slack_ratio=k.slack_ratio, cold_slack_s=k.cold_slack_s,
                             replicate_cost=k.replicate_cost,
                             replicas=ReplicaSets(idle_s=k.replica_idle_s,
                                                 hot_uses=k.hot_requests))
    if name == "prefix_aware":
        return PrefixAware(epsilon=k.epsilon, min_match=k.min_match, warm_ratio=k.warm_ratio)
    if name == "llmd_weighted":
        return LlmdWeighted()
    if name == "consistent_hash":
        return ConsistentHash()
    if name == "least_loaded":
        return LeastLoaded()
    if name == "round_robin":
        return RoundRobin()
    raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICY_NAMES)}")


__all__ = ["POLICY_NAMES", "Decision", "Policy", "PolicyKnobs", "make_policy"]
