"""The router's view of its workers: identity, health, load and where they came from."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from router.fleet.breaker import CircuitBreaker
from router.fleet.view import FleetView, PoolTally
from router.fleet.worker_cost import WorkerCost

if TYPE_CHECKING:  # precise mode is optional: its types only, no ZMQ import
    from router.protocol.kv_feed import FeedParams

log = logging.getLogger(__name__)

Hook = Callable[["Worker"], None]


@dataclass(frozen=True, slots=True)
class LoraAdapter:
    """A LoRA adapter a worker has loaded: vLLM lists it in /v1/models with its parent
    (the base model) and its path as ``root``; the path enters its block hashes."""

    name: str
    parent: str
    path: str


@dataclass(eq=False, slots=True)
class Worker:
    """One upstream engine. ``load`` is what the bounded-load policy counts."""

    id: str
    url: str
    models: frozenset[str] = frozenset()  # base models and the adapters loaded
    adapters: Mapping[str, LoraAdapter] = field(default_factory=dict)
    source: str = "static"  # static | registry | admin
    healthy: bool = False
    draining: bool = False
    in_flight: int = 0  # this router's requests, dispatch to last byte
    external_load: int = 0  # other replicas' in-flight and the engine's own queue
    routed: int = 0
    capacity_blocks: int = 0  # engine KV capacity in engine blocks (0 = unknown)
    block_size: int = 16
    residency_blocks: int = 0  # the residency cap applied for it, in chain blocks
    breaker: CircuitBreaker = field(default_factory=CircuitBreaker)
    cost: WorkerCost = field(default_factory=WorkerCost)  # prefill queued, decodes, rate
    kv_events: FeedParams | None = None  # the KV-event feed it publishes (precise mode)
    heard_s: float = 0.0  # time.monotonic() of the last byte it sent on any request
    # the key presented to it in place of the client's Authorization (router/fleet/
    # upstream_keys.py); kept out of repr so it never reaches a log line
    api_key: str | None = field(default=None, repr=False)
    key_fingerprint: str = ""  # the key its registry record says its engine demands
    # the pool's running total of load, which every change of ``load`` keeps current
    tally: PoolTally = field(default_factory=PoolTally, repr=False)

    def begin(self) -> None:
        """A request of this router's dispatched to it."""
        self.in_flight += 1
        self.tally.total += 1

    def finish(self) -> None:
        self.in_flight -= 1
        self.tally.total -= 1

    def set_external_load(self, load: int) -> None:
        self.tally.total += load - self.external_load
        self.external_load = load

    def set_serving(self, models: frozenset[str] | None = None,
                    adapters: Mapping[str, LoraAdapter] | None = None,
                    draining: bool | None = None) -> None:
        """What it serves, and whether it takes new requests: the pool's views follow."""
        if models is not None:
            self.models = models
        if adapters is not None:
            self.adapters = adapters
        if draining is not None:
            self.draining = draining
        self.tally.generation += 1

    def auth_headers(self) -> dict[str, str]:
        """What the router's own requests to it (health, models, metrics, LoRA) carry."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def streaming_within(self, seconds: float, now: float) -> bool:
        """Bytes arrived on its requests in the last ``seconds`` (a probe's own wait): it is
        alive, whatever the probe says; a stopped process sends nothing. An engine busy
        streaming can answer /health late (vLLM's API server shares one event loop with
        every stream); that is load, not death."""
        return self.in_flight > 0 and now - self.heard_s <= seconds

    def prefilling_within(self, seconds: float, now: float) -> bool:
        """Silent for less than twice the time the prefill queued on it takes (at its learned
        rate), plus ``seconds``: an engine computing a 100 k-token prompt sends nothing for
        seconds, and a stopped one stays silent past that. Marking such a worker down
        moved its queued prompts to cold workers (live Mooncake replay: a 122 k-token turn
        that waited warm was recomputed elsewhere, 19.6 s to its first token)."""
        cost = self.cost
        if self.in_flight <= 0 or cost.pending <= 0:
            return False
        busy_s = 2 * cost.pending_tokens / cost.prefill.rate
        if busy_s <= seconds:  # a queue shorter than the probe's wait explains no silence:
            return False  # a stopped worker goes down as fast as before
        return now - max(self.heard_s, cost.draining_since) <= seconds + busy_s

    @property
    def load(self) -> int:
        return self.in_flight + self.external_load

    def serves(self, model: str | None) -> bool:
        """A worker whose model list is not known yet is assumed to serve anything."""
        return model is None or not self.models or model in self.models

    def routable(self) -> bool:
        return self.healthy and not self.draining and self.breaker.allows()

    def describe(self) -> dict[str, object]:
        return {
            "id": self.id,
            "url": self.url,
            "models": sorted(self.models),
            "source": self.source,
            "healthy": self.healthy,
            "draining": self.draining,
            "breaker": self.breaker.state.value,
            "in_flight": self.in_flight,
            "external_load": self.external_load,
            "routed": self.routed,
            "capacity_blocks": self.capacity_blocks,
            "pending_prefill_tokens": round(self.cost.queued_tokens()),
            "decoding": round(self.cost.decode_load(), 2),
            "prefill_tokens_per_s": round(self.cost.prefill.rate),
            "upstream_key": self.api_key is not None,  # whether, never which
        }


class WorkerPool:
    """Workers by id, and the one way in and out of the pool.

    Whatever keeps per-worker state outside the pool (residency, metrics, KV-event feeds,
    hot-prefix replicas) registers hooks here rather than being called by each path that
    adds or removes a worker (admin API, discovery, start-up): router/server/pool_hooks.py."""

    def __init__(self) -> None:
        self._workers: dict[str, Worker] = {}
        self._tally = PoolTally()
        self._views: dict[str | None, FleetView] = {}
        self.on_added: list[Hook] = []
        self.on_removed: list[Hook] = []
        self.on_down: list[Hook] = []  # a healthy worker failed its health check

    def __iter__(self) -> Iterator[Worker]:
        return iter(list(self._workers.values()))

    def __len__(self) -> int:
        return len(self._workers)

    def get(self, worker_id: str) -> Worker | None:
        return self._workers.get(worker_id)

    def add(self, worker: Worker) -> Worker:
        """Add a worker; the one already there if it is the same engine (same id, address
        and KV-event feed). One of the same id at another address or feed is a restarted
        engine with a cold cache: it is removed first, with its hooks."""
        existing = self._workers.get(worker.id)
        if existing is not None:
            if existing.url == worker.url and existing.kv_events == worker.kv_events:
                return existing
            self.remove(existing.id)
        self._workers[worker.id] = worker
        worker.tally = self._tally
        self._tally.total += worker.load
        self._tally.generation += 1
        _run(self.on_added, worker)
        return worker

    def remove(self, worker_id: str) -> Worker | None:
        worker = self._workers.pop(worker_id, None)
        if worker is not None:
            self._tally.total -= worker.load
            worker.tally = PoolTally()
            self._tally.generation += 1
            _run(self.on_removed, worker)
        return worker

    def view(self, model: str | None) -> FleetView:
        """The healthy, not draining workers serving ``model``, built once per change of the
        pool (membership, health, ``Worker.set_serving``) rather than per request (a
        1,000-worker pass costs ~0.3 ms). Breakers are not in it: they open and close on
        their own clock, so a decision checks each candidate's live. The pool's load total
        is recounted at each rebuild, so a load set by hand (tests, benches) cannot leave it
        wrong for longer than that."""
        view = self._views.get(model)
        generation = self._tally.generation
        if view is None or view.generation != generation:
            if len(self._views) > 64:
                self._views.clear()
            self._tally.total = sum(w.load for w in self._workers.values())
            serving = self._members(model)
            view = self._views[model] = FleetView(
                [w for w in serving if w.healthy and not w.draining], generation,
                self._tally, whole_pool=len(serving) == len(self._workers))
        return view

    def set_health(self, worker: Worker, healthy: bool, answered: bool = False) -> None:
        """Record a health check's verdict; a worker going down without answering its probe
        (dead or hung) runs the ``on_down`` hooks: the proxy stops waiting on it. One that
        answers "not ready" (a 503 while it drains) gets no new requests, but those it
        holds finish there; if its engine has died they fail and are retried as usual."""
        was, worker.healthy = worker.healthy, healthy
        if was != healthy:
            self._tally.generation += 1
        if was and not healthy and not answered:
            _run(self.on_down, worker)

    def candidates(self, model: str | None) -> list[Worker]:
        """Routable workers serving the model; for a LoRA adapter only those that list it
        loaded (one whose model list is not known yet may not have it)."""
        return [w for w in self._members(model) if w.routable()]

    def _members(self, model: str | None) -> list[Worker]:
        if model is not None and self.adapter(model) is not None:
            return [w for w in self._workers.values() if model in w.adapters]
        return [w for w in self._workers.values() if w.serves(model)]

    def adapter(self, model: str) -> LoraAdapter | None:
        """The adapter ``model`` names, as some worker loaded it (None: not an adapter)."""
        for worker in self._workers.values():
            if model in worker.adapters:
                return worker.adapters[model]
        return None

    def knows_model(self, model: str) -> bool:
        return any(w.serves(model) for w in self._workers.values())

    def models(self) -> list[str]:
        return sorted({m for w in self._workers.values() for m in w.models})

    def healthy_count(self) -> int:
        """Workers that pass health checks and are not draining (what readiness reports)."""
        return sum(1 for w in self._workers.values() if w.healthy and not w.draining)


def _run(hooks: list[Hook], worker: Worker) -> None:
    """Every hook runs: one that raises is logged, and must not leave the others' state
    (a removed worker's feed, its residency) behind."""
    for hook in hooks:
        try:
            hook(worker)
        except Exception:
            log.exception("pool hook %r failed for worker %s", hook, worker.id)
