"""What a worker is busy with, in the units a request pays: prefill tokens and decodes.

Counting requests treats a 12 k-token cold prompt and a 40-token warm follow-up as equal.
The router instead keeps, per worker, the predicted uncached prompt tokens of its
requests that have not produced a first byte (the prefill queue a new request waits
behind) and the number past it (decodes that share every engine step). Other router
replicas publish theirs through Redis; the engine's own gauges correct both for traffic
no router saw.

The engine's progress on that queue is not visible between answers, and counting every
pending request's whole work over-counts what is ahead: a 12 k-token prompt half computed
still counted 12 k, so the learned rate came out 1.3-1.9x the engine's (offline replay,
bench/offline.py) and every TTFT was predicted short. With ``drains`` (--queue-drain) this
replica's queue drains at the worker's learned rate from the moment it last knew the
engine's position: a dispatch to an empty queue, or a first byte (the engine runs its
queue in order, so everything ahead of that request is done). Off by default until a live
comparison shows it helps: the quiet RAG pair with it on (bench/README.md, ttft-rag-s3)
did worse against llm-d's scorers than the previous pair without it, cause not separated.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from router.fleet.prefill_gate import PrefillGate
from router.fleet.prefill_model import PrefillModel, leading_work


@dataclass(slots=True)
class WorkerCost:
    pending_tokens: float = 0.0  # this replica's requests before their first byte
    pending: int = 0
    draining_since: float = 0.0  # when the engine last started on what pending_tokens holds
    drains: bool = False  # pending work drains at the learned rate (see above)
    busy_tokens: float = 0.0  # uncached prompt tokens dispatched since the prefill queue
    # was last empty: the engine cuts its prefill steps from the start of that busy period
    decoding: int = 0  # this replica's requests past their first byte
    shared_pending_tokens: float = 0.0  # other replicas' (Redis), fresh or zero
    shared_decoding: float = 0.0
    engine_excess_tokens: float = 0.0  # engine queue no router accounts for, in tokens
    engine_excess_decoding: float = 0.0
    kv_usage: float = 0.0  # vllm:kv_cache_usage_perc, 0..1
    prefill: PrefillModel = field(default_factory=PrefillModel)
    gate: PrefillGate = field(default_factory=PrefillGate)  # this replica's streams
    prefilling: list[tuple[bytes, ...]] = field(default_factory=list)  # the residency
    # chains of this replica's requests before their first byte: the engine caches a
    # prompt's blocks as it computes them, so a request queued behind finds them warm

    def queued_tokens(self, now: float | None = None) -> float:
        return self.own_queue(now) + self.shared_pending_tokens + self.engine_excess_tokens

    def own_queue(self, now: float | None = None) -> float:
        """This replica's pending work the engine has not computed yet, by now."""
        if not self.drains or self.pending_tokens <= 0.0:
            return self.pending_tokens if self.pending_tokens > 0.0 else 0.0
        elapsed = (time.monotonic() if now is None else now) - self.draining_since
        return max(0.0, self.pending_tokens - max(0.0, elapsed) * self.prefill.rate)

    def step_delay_s(self, tokens: float, cached: float, work: float, chunk: float) -> float:
        """How much later the last prompt queued here gets its first token if a prompt of
        ``tokens`` uncached (``cached`` reused, ``work`` its prefill_work) joins now: its
        first tokens fill what the step finishing that prompt has left. Steps are cut from
        the start of the worker's busy period, so that room is counted in the prompt
        tokens dispatched since its queue was last empty (``busy_tokens``), not in the
        drained work ahead: mixing the two put the room at a few hundred tokens where the
        engine left thousands (offline: a follower's predicted 20-30 ms delay was 110-190
        ms). Those first tokens are priced at their position (``leading_work``), not as a
        share of a long prompt's average: live, that charged 0.78 s for a 0.3 s step and
        moved a cold 120 k-token prompt off its idle ring owner."""
        if self.pending <= 0 or chunk <= 0 or tokens <= 0:
            return 0.0
        room = -self.busy_tokens % chunk
        return leading_work(room, tokens, cached, work) / self.prefill.rate

    def dispatched(self, work: float, now: float, tokens: float = 0.0,
                   fresh: bool = False) -> None:
        """``work``: the prefill it adds (attention priced); ``tokens``: its uncached ones;
        ``fresh``: held until the queue ahead has its first bytes (prefill_gate.py), it
        starts a step of its own."""
        if self.pending == 0:
            self.draining_since = now  # an empty queue: the engine starts on this one now
        if self.pending == 0 or fresh:
            self.busy_tokens = 0.0
        self.busy_tokens += tokens
        self.pending_tokens += work
        self.pending += 1

    def prefilled(self, work: float, now: float) -> None:
        """A first byte: this request's prefill is done, and so is all work ahead of it."""
        self.pending_tokens = max(0.0, self.pending_tokens - work)
        self.pending -= 1
        self.draining_since = now

    def abandoned(self, work: float) -> None:
        """Gone before its first byte (a failure, a client that left)."""
        self.pending_tokens = max(0.0, self.pending_tokens - work)
        self.pending -= 1

    def decode_load(self) -> float:
        return self.decoding + self.shared_decoding + self.engine_excess_decoding
