"""A formula-level reproduction of llm-d's default scheduling profile, for comparison.

llm-d's inference scheduler (its published default ``plugins.yaml`` / "well-lit path"
for prefix-cache-aware routing) scores every endpoint with weighted scorers and picks
the highest total, ties at random:
- prefix-cache-scorer, weight 3: the share of the prompt's blocks the endpoint holds;
- queue-scorer, weight 2: min-max normalised waiting queue, 1 for the shortest;
- kv-cache-utilization-scorer, weight 2: 1 - KV-cache usage.
Written from those published defaults, not from llm-d's code. The waiting queue is this
router's requests without a first byte plus the engine's unaccounted queue (llm-d reads
``vllm:num_requests_waiting`` every 50 ms; ours is fresher), KV usage the scraped gauge.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from router.routing.candidate import Candidate
from router.routing.policies.base import Decision
from router.routing.request import RoutingRequest

PREFIX_WEIGHT, QUEUE_WEIGHT, KV_WEIGHT = 3.0, 2.0, 2.0


def _queue(c: Candidate) -> float:
    cost = c.worker.cost
    return cost.pending + cost.engine_excess_tokens / 4096.0  # excess in ~prompt units


class LlmdWeighted:
    name = "llmd_weighted"
    needs: tuple[str, ...] = ("residency", "load")
    shortlists = False

    def __init__(self, seed: int = 0, depth: int = 4) -> None:
        self._random = random.Random(seed)
        self.depth = depth

    def rank(self, request: RoutingRequest, candidates: Sequence[Candidate]) -> Decision:
        blocks = len(request.key.chain) or 1
        queues = [_queue(c) for c in candidates]
        low, high = min(queues), max(queues)
        span = high - low

        def score(item: tuple[Candidate, float]) -> tuple[float, float]:
            c, q = item
            queue_score = 1.0 if span == 0 else (high - q) / span
            total = (PREFIX_WEIGHT * min(1.0, c.matched_blocks / blocks)
                     + QUEUE_WEIGHT * queue_score + KV_WEIGHT * (1.0 - c.kv_usage))
            return total, self._random.random()

        ranked = sorted(zip(candidates, queues, strict=True), key=score, reverse=True)
        return Decision([c for c, _ in ranked[: self.depth]], "weighted")
