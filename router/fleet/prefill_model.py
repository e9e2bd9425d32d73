"""A worker's prefill speed, learned online from its own answers.

Time to first byte is fitted as ``base + tokens / rate``, where ``tokens`` is what the
engine had to compute before answering: the uncached prompt tokens queued ahead of the
request plus its own. A weighted least-squares line with exponential forgetting tracks a
worker that slows down (longer contexts, a noisy neighbour) within a few dozen answers.

Each worker's line is pulled toward its fleet's (``parent``: every answer of every worker
teaches it), through two pseudo-observations on the parent's line worth ``prior_weight``
answers; the fleet's own line is pulled toward the seed rate the same way. Why: fitted
alone, identical simulated workers learned 10-23 k tokens/s within a minute of a Mooncake
replay; the policy then avoided the ones that looked slow, they got no answers to correct
the estimate, and the rest queued. A worker now departs from its fleet only as far as its
own answers, in number, outweigh the fleet's evidence.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

# Llama-3-8B's (--attention-tokens): on by default since the multi-seed offline replays
# (bench/README.md) showed it, with the draining queue, lifting the Mooncake replay's hit
# rate from 90 to 96 % of the bound; set it per model (~53 k for 70B).
ATTENTION_TOKENS = 32768.0


def prefill_work(new_tokens: float, cached_tokens: float,
                 attention_tokens: float = ATTENTION_TOKENS) -> float:
    """Prefill work in token-equivalents: each new token costs its pass through the weights
    (2 x params FLOPs) plus attention over the context before it, which grows with that
    context (4 x layers x heads x head_dim FLOPs per query-key pair). ``attention_tokens``
    is the context length at which the two are equal, params / (2 x layers x width):
    ~30 k for Llama-3-8B, ~53 k for 70B. A line in plain tokens under-predicted 40-200 k
    token prompts 1.4x on the Mooncake replay, and a warm turn after 50 k cached tokens
    costs 2.5x its new tokens; 0 turns the term off."""
    if attention_tokens <= 0:
        return new_tokens
    return new_tokens * (1.0 + (cached_tokens + new_tokens / 2.0) / attention_tokens)


def leading_work(n: float, new_tokens: float, cached_tokens: float, work: float) -> float:
    """The work of the first ``n`` of a prompt's ``new_tokens``, given their total ``work``
    (``prefill_work``'s): a token's attention grows with its position, so a 120 k-token
    prompt's first 8 k tokens cost what a short prompt's do, not a share of its average
    (that share priced the step it fills 2.5x too long). The slope is read off ``work``,
    so it holds for any ``attention_tokens``."""
    if n >= new_tokens:
        return work
    if n <= 0.0:
        return 0.0
    slope = (work / new_tokens - 1.0) / (cached_tokens + new_tokens / 2.0)
    return n * (1.0 + (cached_tokens + n / 2.0) * slope)


PRIOR_TOKENS = 4096.0  # where the seed line is pinned (a typical RAG prompt)
MIN_RATE = 1.0  # tokens/s: a slope this flat means "no information", not "infinitely slow"


@dataclass(slots=True)
class PrefillModel:
    seed_rate: float = 20_000.0  # tokens/s before the worker has answered
    seed_base_s: float = 0.02  # fixed cost of a step and the first decode
    prior_weight: float = 4.0  # in answers; kept forever, so a line always exists and one
    # noisy answer cannot swing it (identical workers learned 10-23 k tokens/s at 0.5)
    decay: float = 0.97  # weight an older answer keeps at each new one (~33 remembered)
    base_s: float = 0.0
    rate: float = 0.0
    samples: int = 0
    parent: PrefillModel | None = None  # the fleet's line (None: this is the fleet's)
    observed_at: float = 0.0  # monotonic time of the last answer
    _sums: list[float] = field(default_factory=lambda: [0.0] * 5)  # s, sx, sy, sxx, sxy

    def __post_init__(self) -> None:
        self.base_s, self.rate = self.seed_base_s, self.seed_rate

    def observe(self, tokens: float, seconds: float) -> None:
        """One answer: ``seconds`` to first byte after ``tokens`` of prefill work."""
        if seconds <= 0 or tokens < 0:
            return
        if self.parent is not None:
            self.parent.observe(tokens, seconds)
        self.observed_at = time.monotonic()
        d, s = self.decay, self._sums
        s[0] = s[0] * d + 1.0
        s[1] = s[1] * d + tokens
        s[2] = s[2] * d + seconds
        s[3] = s[3] * d + tokens * tokens
        s[4] = s[4] * d + tokens * seconds
        self.samples += 1
        self._fit()

    def _fit(self) -> None:
        w, x1 = self.prior_weight, PRIOR_TOKENS
        base, rate = ((self.seed_base_s, self.seed_rate) if self.parent is None
                      else (self.parent.base_s, self.parent.rate))
        y0, y1 = base, base + PRIOR_TOKENS / rate
        n, sx, sy, sxx, sxy = self._sums
        n, sx, sy = n + 2 * w, sx + w * x1, sy + w * (y0 + y1)
        sxx, sxy = sxx + w * x1 * x1, sxy + w * x1 * y1
        var = n * sxx - sx * sx
        if var <= 0:
            return
        slope = (n * sxy - sx * sy) / var
        slope = min(max(slope, 1e-8), 1.0 / MIN_RATE)
        self.rate = 1.0 / slope
        self.base_s = max(0.0, (sy - slope * sx) / n)

    def refresh(self, stale_s: float = 30.0) -> None:
        """Off the request path: a worker that has not answered for ``stale_s`` (because its
        line made it look slow, say) forgets its own answers and takes the fleet's line."""
        parent = self.parent
        if parent is None:
            return
        if self.samples == 0 or time.monotonic() - self.observed_at > stale_s:
            self._sums = [0.0] * 5
            self.samples = 0
            self.base_s, self.rate = parent.base_s, parent.rate

    def child(self, prior_weight: float = 8.0) -> PrefillModel:
        """A worker's line, pulled toward this (the fleet's) one."""
        return PrefillModel(seed_rate=self.rate, seed_base_s=self.base_s,
                            prior_weight=prior_weight, decay=self.decay, parent=self)

    def seconds(self, tokens: float) -> float:
        """Predicted time for ``tokens`` of prefill work, queue included."""
        return self.base_s + tokens / self.rate
