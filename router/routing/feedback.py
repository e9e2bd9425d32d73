"""The closed loop: what the engine found cached against what the router predicted.

Every answer that carries usage says how many prompt tokens the engine reused. The
difference from the prediction is the router's routing precision, exported as metrics.
When the engine found cold a prefix the router believed warm, the engine has evicted it,
and by LRU everything it used less recently too: those entries are dropped from the
worker's residency, so the router's picture follows the engine instead of drifting.
The answers also teach the worker's prefill line (only streams: a whole body's first
byte includes its decode) and the prompt's bytes per token.
"""

from __future__ import annotations

from router.fleet.prefill_model import ATTENTION_TOKENS, prefill_work
from router.infra.metrics import RouterMetrics
from router.residency.base import ResidencyStore
from router.routing.accounting import Attempt
from router.routing.usage import Usage

BYTES_PER_TOKEN = 4.0  # before any answer: English text under Llama-3-class tokenizers
COLD_BLOCKS = 2  # a shortfall of fewer blocks than this is rounding, not an eviction


def _own_tokens(predicted: float, estimated_prompt: float, usage: Usage) -> float:
    """The predicted cached tokens counted at this prompt's own bytes per token, which the
    answer tells: the prediction converts matched bytes at the learned mean, and a prompt
    whose text runs a few per cent denser looked evicted when it was not (offline: 3-31
    false drops a run, each dropping every older entry of the worker's residency)."""
    if estimated_prompt <= 0 or usage.prompt_tokens <= 0:
        return predicted
    return predicted * usage.prompt_tokens / estimated_prompt


class TokenRatio:
    """Prompt bytes per engine token, learned from usage (EWMA)."""

    def __init__(self, initial: float = BYTES_PER_TOKEN, alpha: float = 0.05) -> None:
        self.value = initial
        self._alpha = alpha

    def observe(self, prompt_bytes: int, prompt_tokens: int) -> None:
        if prompt_bytes > 0 and prompt_tokens > 0:
            ratio = prompt_bytes / prompt_tokens
            self.value += self._alpha * (ratio - self.value)


class CacheFeedback:
    def __init__(self, residency: ResidencyStore, metrics: RouterMetrics,
                 ratio: TokenRatio, attention_tokens: float = ATTENTION_TOKENS) -> None:
        self._residency = residency
        self._attention_tokens = attention_tokens
        self._metrics = metrics
        self._ratio = ratio

    def observe(self, attempt: Attempt) -> None:
        usage = attempt.usage
        request = attempt.request
        if usage is None:
            return
        worker = attempt.worker
        predicted = attempt.candidate.cached_tokens
        actual = usage.cached_tokens
        m = self._metrics
        m.cached_predicted.inc(predicted)
        m.cached_actual.inc(actual)
        m.cache_prediction_error.observe(abs(predicted - actual) / max(1, usage.prompt_tokens))
        if attempt.stream and attempt.first_byte_s is not None:
            computed = attempt.ahead_tokens + prefill_work(
                max(0, usage.prompt_tokens - actual), actual, self._attention_tokens)
            worker.cost.prefill.observe(computed, attempt.first_byte_s)
        if request.exact:
            return  # exact residency follows the engine's own KV events
        self._ratio.observe(request.prompt_bytes, usage.prompt_tokens)
        stamp = attempt.stamp
        stored = predicted - attempt.candidate.inflight_tokens  # a prefix still computing
        # there when it was sent is not the residency a shortfall would prove evicted
        if stamp is not None and _own_tokens(stored, request.prompt_tokens, usage) - actual \
                > COLD_BLOCKS * request.tokens_per_block:
            dropped = self._residency.drop_older(worker.id, stamp)
            m.residency_corrections.labels(worker.id).inc()
            m.residency_dropped.inc(dropped)
