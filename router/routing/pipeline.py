"""The request path as one sequence of named steps.

    key -> candidates -> signals -> rank -> forward -> complete

The edge (router/server/handlers.py; bench/scale.py and the tests in process) calls the steps in
that order and does ``forward`` itself, with an Attempt per try from ``attempt``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from router.fleet.prefill_model import ATTENTION_TOKENS
from router.fleet.view import FleetView
from router.fleet.workers import WorkerPool
from router.infra.metrics import RouterMetrics
from router.residency.base import ResidencyStore
from router.routing import keys
from router.routing.accounting import Attempt
from router.routing.candidate import Candidate
from router.routing.errors import Rejected
from router.routing.feedback import CacheFeedback, TokenRatio
from router.routing.policies.base import Decision, Policy
from router.routing.request import RoutingRequest
from router.routing.shortlist import Shortlist
from router.routing.signals import SignalContext, build_signals
from router.routing.signals.base import ExactMatcher

PromptReader = Callable[[dict[str, Any]], bytes]


class PreciseKeyer(ExactMatcher, Protocol):
    """Precise mode (router/precise): vLLM block hashes of the tokenized prompt, and the
    exact residency the residency signal reads (``match``, ``offloaded``)."""

    async def key(self, body: Mapping[str, Any], model: str | None, chat: bool,
                  candidates: list[Any]) -> Any: ...


class Pipeline:
    def __init__(self, pool: WorkerPool, policy: Policy, residency: ResidencyStore,
                 metrics: RouterMetrics, *, block_chars: int, max_blocks: int,
                 key_blocks: int, precise: PreciseKeyer | None = None,
                 decode_penalty_s: float = 0.001, offload_weight: float = 0.9,
                 attention_tokens: float = ATTENTION_TOKENS, shortlist_size: int = 64,
                 prefill_gate_s: float = 0.0, chunk_tokens: float = 8192.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.pool = pool
        self.policy = policy
        self.residency = residency
        self.metrics = metrics
        self.block_chars = block_chars
        self.max_blocks = max_blocks
        self.key_blocks = key_blocks
        self.ratio = TokenRatio()
        self.mean_uncached = 2048.0  # uncached prompt tokens per dispatch (EWMA), to price
        # an engine's queue that no router accounts for (router/fleet/engine_cost.py)
        self._decode_penalty_s = decode_penalty_s
        self._offload_weight = offload_weight
        self._attention_tokens = attention_tokens
        self.prefill_gate_s = prefill_gate_s  # 0: no stream is held (router/fleet/prefill_gate.py)
        self.chunk_tokens = chunk_tokens
        # streams the proxy sends take a place in their worker's prefill gate only where
        # one could be held: the gate on, and a policy that predicts each try's prefill
        self.gated = prefill_gate_s > 0.0 and "ttft" in policy.needs
        self.clock = clock
        self.shortlist = Shortlist(size=shortlist_size, rings=getattr(policy, "rings", None))
        self.precise: PreciseKeyer | None = None
        self.use_precise(precise)
        self.feedback = CacheFeedback(residency, metrics, self.ratio, attention_tokens)
        self.on_first_byte: list[Callable[[Attempt], None]] = []  # a prefill ended (admission)

    def use_precise(self, precise: PreciseKeyer | None) -> None:
        """Precise mode starts with the app (tokenizers, KV-event feeds), after the pipeline."""
        self.precise = precise if "residency" in self.policy.needs else None
        self.signals = build_signals(self.policy.needs, SignalContext(
            self.residency, exact=self.precise, decode_penalty_s=self._decode_penalty_s,
            offload_weight=self._offload_weight, attention_tokens=self._attention_tokens,
            clock=self.clock))

    # -- the fleet, the key, the candidates -------------------------------------------
    def fleet(self, model: str | None) -> FleetView:
        """Healthy, not draining, serving the model (the pool's view, rebuilt per change)."""
        fleet = self.pool.view(model)
        if not fleet.workers and model is not None and not self.pool.knows_model(model):
            raise Rejected(404, f"model {model!r} is not served by any worker",
                           "model_not_found")
        return fleet

    async def candidates(self, request: RoutingRequest, fleet: FleetView) -> list[Candidate]:
        """The workers this decision weighs: every routable one, or for a large fleet and
        a policy that reads the fleet's totals (``shortlists``), those that can matter
        (shortlist.py)."""
        if self.policy.shortlists and self.shortlist.applies(fleet):
            candidates = await self.shortlist.select(
                request, fleet, self._match if "residency" in self.policy.needs else None)
            if candidates:
                return candidates
        return self.routable(fleet)

    def routable(self, fleet: FleetView) -> list[Candidate]:
        """Every worker of the fleet whose breaker lets a request through."""
        candidates = [Candidate(w) for w in fleet.workers if w.routable()]
        if not candidates:
            raise Rejected(503, "no healthy worker can take the request now",
                           "no_worker_available", retry_after=1)
        return candidates

    async def _match(self, request: RoutingRequest, ids: frozenset[str]) -> dict[str, int]:
        if request.exact and self.precise is not None:
            return dict(self.precise.match(request.key.chain, ids))
        return await self.residency.match(request.key.chain, ids)

    async def key(self, payload: dict[str, Any], model: str | None, chat: bool,
                  read_prompt: PromptReader, context_hash: str | None,
                  fleet: FleetView) -> RoutingRequest:
        """The ring key: X-Context-Hash when sent, else the prompt's chain at ``key_blocks``.
        Residency is always matched on the prompt's own chain, so a header that names
        a whole retrieved set never hides the documents it shares with other sets."""
        try:
            if context_hash is not None:
                keys.check_context_hash(context_hash)
            request = None
            if self.precise is not None:
                exact = await self.precise.key(payload, model, chat, fleet.workers)
                if exact is not None:
                    request = RoutingRequest(exact.key, exact.num_tokens, exact.block_size,
                                             model, source="precise", exact=True)
            if request is None:
                prompt = read_prompt(payload)
                key = keys.prompt_key(prompt, model or "", self.block_chars, self.max_blocks,
                                      self.key_blocks, keys.cache_salt(payload))
                ratio = self.ratio.value
                request = RoutingRequest(key, len(prompt) / ratio, self.block_chars / ratio,
                                         model, prompt_bytes=len(prompt),
                                         head_blocks=self.max_blocks)
        except keys.InvalidPrompt as exc:
            raise Rejected(400, str(exc), "invalid_prompt") from None
        if context_hash is not None:
            request.key = keys.RoutingKey(context_hash.lower(), request.key.chain)
            request.source = "header"
        self.metrics.child(self.metrics.decision_mode, request.source).inc()
        return request

    # -- signals, rank ---------------------------------------------------------------
    async def annotate(self, request: RoutingRequest, candidates: list[Candidate]) -> None:
        for signal in self.signals:
            await signal.annotate(request, candidates)

    def rank(self, request: RoutingRequest, candidates: list[Candidate]) -> Decision:
        decision = self.policy.rank(request, candidates)
        chosen = decision.ranked[0]
        if "residency" in self.policy.needs:
            self.metrics.child(self.metrics.residency,
                               "hit" if chosen.matched_blocks else "miss").inc()
        if decision.replicas:
            self.metrics.context_replicas.observe(decision.replicas)
        return decision

    # -- forward (the edge) and complete ---------------------------------------------
    def attempt(self, request: RoutingRequest, candidate: Candidate, stream: bool,
                may_hold: bool = False) -> Attempt:
        """One try on one worker; the edge calls first_byte/saw/end on it. ``may_hold``: the
        edge sends it itself and awaits ``Attempt.cleared`` first (the proxy; not the
        endpoint picker, where Envoy sends), so a stream whose first tokens would delay
        the prompt queued ahead by more than ``prefill_gate_s`` is held."""
        gated = may_hold and stream and self.gated
        hold = gated and candidate.worker.cost.step_delay_s(
            candidate.uncached_tokens, candidate.cached_tokens, candidate.prefill_work,
            self.chunk_tokens) > self.prefill_gate_s
        attempt = Attempt(request, candidate, stream, self._served, self.clock(), gated, hold)
        if attempt.held:
            self.metrics.prefill_holds.inc()
        self.mean_uncached += 0.02 * (candidate.uncached_tokens - self.mean_uncached)
        if candidate.matched_blocks and not request.exact:
            # the oldest block believed warm: if the engine misses it, all older is gone
            attempt.stamp = self.residency.stamp(
                candidate.id, request.key.chain[candidate.matched_blocks - 1])
        return attempt

    def _served(self, attempt: Attempt) -> None:
        """First byte: the engine has computed the prompt, so it is resident there now."""
        if not attempt.request.exact and attempt.request.key.chain:
            self.residency.record(attempt.worker.id, attempt.request.key.chain)
        for listener in self.on_first_byte:
            listener(attempt)

    def complete(self, attempts: list[Attempt]) -> None:
        """After the last byte: learn from what the engines said about each try."""
        for attempt in attempts:
            self.feedback.observe(attempt)
