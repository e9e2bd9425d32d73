"""Routing policies, one module each, behind ``router.routing.policies.base.Policy``."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from router.config import POLICY_NAMES, RouterConfig
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
    cold_slack_ratio: float = 0.05
    replicate_cost: float = 1.0
    copy_share: float = 0.005
    copy_evict_cost: float = 1.0
    chunk_tokens: int = 8192
    replica_idle_s: float = 30.0
    hot_requests: int = 3
    min_match: int = 1
    warm_ratio: float = 0.5

    @classmethod
    def of(cls, config: RouterConfig) -> PolicyKnobs:
        return cls(epsilon=config.bound_epsilon, margin=config.bound_margin,
                   slack_s=config.slack_s, slack_ratio=config.slack_ratio,
                   cold_slack_s=config.cold_slack_s,
                   cold_slack_ratio=config.cold_slack_ratio, replicate_cost=config.replicate_cost,
                   copy_share=config.copy_share, copy_evict_cost=config.copy_evict_cost,
                   chunk_tokens=config.prefill_chunk_tokens,
                   replica_idle_s=config.replica_idle_s,
                   hot_requests=config.hot_requests,
                   min_match=config.min_match, warm_ratio=config.warm_ratio)


def make_policy(name: str, knobs: PolicyKnobs | None = None,
                clock: Callable[[], float] = time.monotonic) -> Policy:
    """``clock``: what replica idleness is measured on (the offline bench's simulated time)."""
    k = knobs or PolicyKnobs()
    if name == "predicted_ttft":
        return PredictedTTFT(epsilon=k.epsilon, margin=k.margin, slack_s=k.slack_s,
                             slack_ratio=k.slack_ratio, cold_slack_s=k.cold_slack_s,
                             cold_slack_ratio=k.cold_slack_ratio,
                             replicate_cost=k.replicate_cost, copy_share=k.copy_share,
                             evict_cost=k.copy_evict_cost, chunk_tokens=k.chunk_tokens,
                             replicas=ReplicaSets(idle_s=k.replica_idle_s,
                                                 hot_uses=k.hot_requests, clock=clock))
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
