"""Predicted time to first token: the queue ahead plus this request's uncached prefill.

ttft(w) = prefill_w(queued work + this request's work) + decode_penalty x decodes on w,
where prefill_w is the worker's learned line and work is uncached tokens priced with the
attention they pay over the context before them (router/fleet/prefill_model.py). Reads
what the residency and load signals wrote, so it is registered after them.
"""

from __future__ import annotations

from router.fleet.prefill_model import prefill_work
from router.routing.candidate import Candidate
from router.routing.request import RoutingRequest
from router.routing.signals.base import SignalContext


class TTFTSignal:
    name = "ttft"

    def __init__(self, context: SignalContext) -> None:
        self._decode_penalty_s = context.decode_penalty_s
        self._attention_tokens = context.attention_tokens

    async def annotate(self, request: RoutingRequest, candidates: list[Candidate]) -> None:
        total = request.prompt_tokens
        penalty, attention = self._decode_penalty_s, self._attention_tokens
        for c in candidates:
            c.uncached_tokens = uncached = max(0.0, total - c.cached_tokens)
            c.prefill_work = work = prefill_work(uncached, c.cached_tokens, attention)
            c.ttft_s = (c.worker.cost.prefill.seconds(c.queued_tokens + work)
                        + penalty * c.decode_load)
