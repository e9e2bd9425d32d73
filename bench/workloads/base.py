"""What a workload is: a list of OpenAI completions requests with simulated arrival times."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BenchRequest:
    """One request. ``arrival_s`` is in simulated seconds from the start of the run.

    ``prompt_tokens`` is the exact count under the simulator's tokenizer (see text.py);
    ``context_hash`` is what a client would send as X-Context-Hash (None: not sent).
    """

    index: int
    arrival_s: float
    prompt: str
    prompt_tokens: int
    max_tokens: int
    context_hash: str | None = None
    group: str = ""  # the shared context (document ids, conversation id, ...), for analysis


def context_hash(context: str) -> str:
    """The SDK's contract (README, "The key contract"): sha256 of the context, 16 hex chars."""
    return hashlib.sha256(context.encode()).hexdigest()[:16]


def in_arrival_order(pending: list[BenchRequest], count: int | None) -> list[BenchRequest]:
    """Sort generated requests by arrival, keep the first ``count``, number them in order."""
    pending = sorted(pending, key=lambda r: r.arrival_s)
    if count is not None:
        pending = pending[:count]
    return [BenchRequest(index=i, arrival_s=r.arrival_s, prompt=r.prompt,
                         prompt_tokens=r.prompt_tokens, max_tokens=r.max_tokens,
                         context_hash=r.context_hash, group=r.group)
            for i, r in enumerate(pending)]
