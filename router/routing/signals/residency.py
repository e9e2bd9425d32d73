"""Residency: how much of this prompt each candidate holds warm, in blocks and tokens.

Tiers: in precise mode the engines' KV events also say what an offload tier (LMCache's CPU
memory or disk, vLLM's CPU offload) holds. A block there is loaded over PCIe rather than
computed, so it counts as ``offload_weight`` of a cached token (0.9: for Llama-3-8B on an
H100 a token's 128 KiB crosses PCIe in ~2 µs against ~45 µs of prefill, less the fixed
cost of a transfer). The approximate store knows one tier: what the router routed.

In flight: a prompt is recorded resident at its first byte, but the engine caches its
blocks as it computes them, and a request queued behind it on that worker finds them
warm. So a prefix this router has sent to a worker and that has no first byte yet counts
as cached there too (its queue, which the prediction already waits out, computes it).
Uncounted, a request sharing a new prefix with one still prefilling (a document's next
question, an agent's parallel step) was predicted to compute it all again at home. Not
residency yet: recorded at the first byte, and the closed loop takes no shortfall on it
for an eviction (routing/feedback.py).
"""

from __future__ import annotations

from router.routing.candidate import Candidate
from router.routing.keys import shared_links
from router.routing.request import RoutingRequest
from router.routing.signals.base import SignalContext


class ResidencySignal:
    """One lookup for all candidates: a Lua call in Redis, a dict probe in memory."""

    name = "residency"

    def __init__(self, context: SignalContext) -> None:
        self._store = context.residency
        self._exact = context.exact
        self._offload_weight = context.offload_weight

    async def annotate(self, request: RoutingRequest, candidates: list[Candidate]) -> None:
        chain = request.key.chain
        if not chain:
            return
        ids = [c.id for c in candidates]
        offloaded: dict[str, int] = {}
        matches = request.matches  # looked up over the fleet when it was shortlisted
        if request.exact and self._exact is not None:
            if matches is None:
                matches = dict(self._exact.match(chain, ids))
            offloaded = dict(self._exact.offloaded(chain, matches, ids))
        elif matches is None:
            matches = await self._store.match(chain, ids)
        weight = self._offload_weight
        for c in candidates:
            blocks = matches.get(c.id, 0)
            if blocks:
                c.matched_blocks = blocks
                c.cached_tokens = request.cached_tokens(blocks)
            extra = offloaded.get(c.id, 0)
            if extra:
                c.offloaded_blocks = extra
                c.cached_tokens += weight * (request.cached_tokens(blocks + extra)
                                             - request.cached_tokens(blocks))
            held = deepest = blocks + extra
            for other in c.worker.cost.prefilling:
                # one comparison for a chain that shares no more than is held already
                if deepest < len(chain) and len(other) > deepest \
                        and other[deepest] == chain[deepest]:
                    deepest = shared_links(chain, other)
            if deepest > held:
                c.inflight_tokens = request.cached_tokens(deepest) - c.cached_tokens
                c.cached_tokens += c.inflight_tokens
