"""Load in request cost: prefill tokens queued on the worker, decodes sharing its steps."""

from __future__ import annotations

from router.routing.candidate import Candidate
from router.routing.request import RoutingRequest
from router.routing.signals.base import SignalContext


class LoadSignal:
    name = "load"

    def __init__(self, context: SignalContext) -> None:
        self._clock = context.clock

    async def annotate(self, request: RoutingRequest, candidates: list[Candidate]) -> None:
        now = self._clock()
        for c in candidates:
            cost = c.worker.cost
            c.queued_tokens = cost.queued_tokens(now)
            c.decode_load = cost.decode_load()
            c.kv_usage = cost.kv_usage
