"""What routing knows about one request once it is keyed."""

from __future__ import annotations

from dataclasses import dataclass

from router.fleet.view import FleetView
from router.routing.keys import RoutingKey, head_blocks_covered


@dataclass(slots=True)
class RoutingRequest:
    """``key.key`` places the request on the ring; ``key.chain`` matches residency.

    ``tokens_per_block`` converts matched chain blocks into prompt tokens: a text block's
    bytes over the learned bytes per token, or the engine's block size in precise mode.
    A text chain's blocks after its first ``head_blocks`` are longer (keys.block_ends).
    """

    key: RoutingKey
    prompt_tokens: float
    tokens_per_block: float
    model: str | None = None
    prompt_bytes: int = 0  # canonical prompt length, to learn bytes per token
    source: str = "prompt"  # header | prompt | precise
    exact: bool = False  # residency read from the engines' KV events, never recorded
    head_blocks: int = 1 << 30  # the text chain's --max-blocks; precise chains are uniform
    # set when the candidates are a shortlist of a large fleet (router/routing/shortlist.py):
    # the fleet the guard and the ring are read over, and residency as looked up over all of
    # it (worker id -> leading chain blocks, holders only)
    fleet: FleetView | None = None
    matches: dict[str, int] | None = None

    def cached_tokens(self, matched_blocks: int) -> float:
        """The engine reuses whole blocks and always computes the prompt's last token."""
        if matched_blocks <= 0:
            return 0.0
        covered = head_blocks_covered(matched_blocks, self.head_blocks)
        return min(covered * self.tokens_per_block, max(0.0, self.prompt_tokens - 1))
