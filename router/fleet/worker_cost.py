"""What a worker is busy with, in the units a request pays: prefill tokens and decodes.

Counting requests treats a 12 k-token cold prompt and a 40-token warm follow-up as equal.
The router instead keeps, per worker, the predicted uncached prompt tokens of its
requests that have not produced a first byte (the prefill queue a new request waits
behind) and the number past it (decodes that share every engine step). Other router
replicas publish theirs through Redis; the engine's own gauges correct both for traffic
no router saw.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from router.fleet.prefill_model import PrefillModel


@dataclass(slots=True)
class WorkerCost:
    pending_tokens: float = 0.0  # this replica's requests before their first byte
    pending: int = 0
    decoding: int = 0  # this replica's requests past their first byte
    shared_pending_tokens: float = 0.0  # other replicas' (Redis), fresh or zero
    shared_decoding: float = 0.0
    engine_excess_tokens: float = 0.0  # engine queue no router accounts for, in tokens
    engine_excess_decoding: float = 0.0
    kv_usage: float = 0.0  # vllm:kv_cache_usage_perc, 0..1
    prefill: PrefillModel = field(default_factory=PrefillModel)

    def queued_tokens(self) -> float:
        return self.pending_tokens + self.shared_pending_tokens + self.engine_excess_tokens

    def decode_load(self) -> float:
        return self.decoding + self.shared_decoding + self.engine_excess_decoding
