"""A worker's prefill speed, learned online from its own answers.

Time to first byte is fitted as ``base + tokens / rate``, where ``tokens`` is what the
engine had to compute before answering: the uncached prompt tokens queued ahead of the
request plus its own. A weighted least-squares line with exponential forgetting tracks a
worker that slows down (longer contexts, a noisy neighbour) within a few dozen answers;
two pseudo-observations from the seed rate keep the line sane before the first answer and
when every answer so far had about the same size (a slope needs spread in ``tokens``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
    _sums: list[float] = field(default_factory=lambda: [0.0] * 5)  # s, sx, sy, sxx, sxy

    def __post_init__(self) -> None:
        self.base_s, self.rate = self.seed_base_s, self.seed_rate

    def observe(self, tokens: float, seconds: float) -> None:
        """One answer: ``seconds`` to first byte after ``tokens`` of prefill work."""
        if seconds <= 0 or tokens < 0:
            return
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
        y0, y1 = self.seed_base_s, self.seed_base_s + PRIOR_TOKENS / self.seed_rate
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

    def seconds(self, tokens: float) -> float:
        """Predicted time for ``tokens`` of prefill work, queue included."""
        return self.base_s + tokens / self.rate
