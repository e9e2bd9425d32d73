"""A worker as one routing decision sees it: the signals write, the policy reads."""

from __future__ import annotations

from dataclasses import dataclass, field

from router.fleet.workers import Worker


@dataclass(slots=True, eq=False)
class Candidate:
    worker: Worker
    matched_blocks: int = 0  # leading chain blocks resident on the worker
    offloaded_blocks: int = 0  # the next ones, held in an offload tier (precise mode)
    cached_tokens: float = 0.0  # predicted prompt tokens the engine will reuse (offloaded
    # ones weighted by what loading them saves, and those a request ahead is computing)
    inflight_tokens: float = 0.0  # of those, the ones a request ahead is computing there
    uncached_tokens: float = 0.0  # prompt tokens the worker must compute
    prefill_work: float = 0.0  # what that adds to its prefill queue, attention included
    # (router/fleet/prefill_model.py: token-equivalents)
    queued_tokens: float = 0.0  # prefill work ahead of it (every router's and the engine's)
    decode_load: float = 0.0  # requests past their first byte, sharing every engine step
    kv_usage: float = 0.0  # the engine's KV-cache usage, 0..1
    ttft_s: float = 0.0  # predicted time to first token
    id: str = field(init=False)  # the worker's, copied: policies read it per candidate

    def __post_init__(self) -> None:
        self.id = self.worker.id

    @property
    def load(self) -> int:
        """Requests in flight, what the bounded-load guard counts."""
        return self.worker.load


def candidates_of(workers: list[Worker]) -> list[Candidate]:
    return [Candidate(w) for w in workers]
