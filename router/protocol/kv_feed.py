"""The KV-event feed a worker publishes (advertised in its registry record), as the
router subscribes to it: hashes only compare between equal block sizes and seeds."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FeedParams:
    endpoint: str
    replay_endpoint: str | None
    topic: str
    block_size: int
    hash_seed: str
