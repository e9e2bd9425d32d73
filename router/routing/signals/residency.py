"""Residency: how much of this prompt each candidate holds warm, in blocks and tokens."""

from __future__ import annotations

from router.routing.candidate import Candidate
from router.routing.request import RoutingRequest
from router.routing.signals.base import SignalContext


class ResidencySignal:
    """One lookup for all candidates: a Lua call in Redis, a dict probe in memory."""

    name = "residency"

    def __init__(self, context: SignalContext) -> None:
        self._store = context.residency
        self._exact = context.exact

    async def annotate(self, request: RoutingRequest, candidates: list[Candidate]) -> None:
        chain = request.key.chain
        if not chain:
            return
        ids = [c.id for c in candidates]
        if request.exact and self._exact is not None:
            matches = self._exact.match(chain, ids)
        else:
            matches = await self._store.match(chain, ids)
        if not matches:
            return
        for c in candidates:
            blocks = matches.get(c.id, 0)
            if blocks:
                c.matched_blocks = blocks
                c.cached_tokens = request.cached_tokens(blocks)
