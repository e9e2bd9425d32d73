"""The one interface every signal implements, and what signals are built from."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from router.fleet.prefill_model import ATTENTION_TOKENS
from router.residency.base import ResidencyStore
from router.routing.candidate import Candidate
from router.routing.request import RoutingRequest


class ExactMatcher(Protocol):
    """Residency from the engines' own KV events (precise mode)."""

    def match(self, chain: Sequence[bytes], worker_ids: Collection[str]) -> Mapping[str, int]: ...

    def offloaded(self, chain: Sequence[bytes], gpu: Mapping[str, int],
                  worker_ids: Sequence[str]) -> Mapping[str, int]:
        """Blocks after each GPU hit held in an offload tier (CPU, disk)."""
        ...


@dataclass(frozen=True, slots=True)
class SignalContext:
    residency: ResidencyStore
    exact: ExactMatcher | None = None
    decode_penalty_s: float = 0.001  # added TTFT per request decoding on the worker
    attention_tokens: float = ATTENTION_TOKENS  # prefill_work's attention scale
    clock: Callable[[], float] = time.monotonic  # what queues drain on (bench/offline.py:
    # simulated time)
    offload_weight: float = 0.9  # share of a block's prefill saved when it is loaded from
    # an offload tier instead of computed (PCIe transfer vs compute)


class Signal(Protocol):
    name: str

    async def annotate(self, request: RoutingRequest, candidates: list[Candidate]) -> None:
        """Write this signal's fields on every candidate."""
        ...
