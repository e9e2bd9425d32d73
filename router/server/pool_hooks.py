"""What a worker joining or leaving the pool means for the rest of the router, in one place.

Every path that changes the pool (the admin API, registry discovery, start-up) only calls
``WorkerPool.add`` / ``WorkerPool.remove``; the per-worker state kept elsewhere follows
through these hooks:

- joined: its KV-event feed is subscribed (precise mode, when the worker publishes one);
- left: its residency (shared and local) is forgotten, its per-worker metric series are
  removed, its KV-event feed is stopped with its exact residency, and the routing policy's
  hot-prefix replicas (predicted_ttft) stop counting it.

A worker replaced by one of the same id at another address or feed (a restarted engine)
leaves and joins, so its cold cache is not mistaken for the old one's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from router.fleet.workers import Worker

if TYPE_CHECKING:
    from router.server.state import RouterState


def install(state: RouterState) -> None:
    """Register the hooks on ``state.pool`` (once, when the state is built). Each looks up
    what it needs at call time: precise mode and its feeds start after the pool."""

    def subscribe_feed(worker: Worker) -> None:
        if state.precise is not None and worker.kv_events is not None:
            state.precise.feeds.ensure(worker.id, worker.kv_events)

    def forget_residency(worker: Worker) -> None:
        state.residency.forget(worker.id)

    def forget_metrics(worker: Worker) -> None:
        state.metrics.forget_worker(worker.id)

    def drop_feed(worker: Worker) -> None:
        if state.precise is not None:
            state.precise.feeds.drop(worker.id)

    def forget_replicas(worker: Worker) -> None:
        replicas = getattr(state.pipeline.policy, "replicas", None)
        if replicas is not None:
            replicas.forget_worker(worker.id)

    state.pool.on_added.append(subscribe_feed)
    state.pool.on_removed.extend((forget_residency, forget_metrics, drop_feed,
                                  forget_replicas))
