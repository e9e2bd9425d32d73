"""Wiring of precise mode into the app: tokenizers, the exact residency, KV-event feeds.

Kept out of router/precise/ so that package stays free of aiohttp app concerns, and out of
app.py so the router imports ZMQ and transformers only when ``--tokenizers`` is set.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from aiohttp import web

from router.config import RouterConfig
from router.registry import WorkerRecord
from router.state import ROUTER, RouterState
from router.supervisor import SUPERVISOR

if TYPE_CHECKING:
    from router.precise.feeds import FeedParams


def static_feed_params(config: RouterConfig, endpoints: str) -> FeedParams:
    """'EVENTS_URL[|REPLAY_URL]' of a static worker -> its FeedParams."""
    from router.precise.feeds import FeedParams

    events, _, replay = endpoints.partition("|")
    return FeedParams(events, replay or None, config.kv_events_topic,
                      config.precise_block_size, config.precise_hash_seed)


def record_feed_params(record: WorkerRecord) -> FeedParams | None:
    """A registry worker's advertised KV events, or None if it publishes none."""
    from router.precise.feeds import FeedParams

    if not record.kv_events_endpoint or record.extra.get("hash_algo", "sha256_cbor") \
            != "sha256_cbor":
        return None
    return FeedParams(record.kv_events_endpoint,
                      record.extra.get("kv_events_replay_endpoint") or None,
                      record.extra.get("kv_events_topic", "kv-events"), record.block_size,
                      str(record.extra.get("hash_seed", "0")))


def on_registry_record(state: RouterState, record: WorkerRecord) -> None:
    """Discovery saw a worker: subscribe to its KV events if it publishes them."""
    if state.precise is None:
        return
    params = record_feed_params(record)
    if params is not None:
        state.precise.feeds.ensure(record.id, params)


def on_worker_gone(state: RouterState, worker_id: str) -> None:
    if state.precise is not None:
        state.precise.feeds.drop(worker_id)


async def precise_ctx(app: web.Application) -> AsyncIterator[None]:
    """Load tokenizers and subscribe to static workers when precise mode is configured."""
    state = app[ROUTER]
    config = state.config
    if not config.tokenizers:
        yield
        return
    from router.precise.collector import PreciseCollector
    from router.precise.exact import ExactResidency
    from router.precise.feeds import KVEventFeeds
    from router.precise.matcher import PreciseMatcher
    from router.precise.tokenize import load_tokenizers

    feeds = KVEventFeeds(ExactResidency(), app[SUPERVISOR])
    state.precise = PreciseMatcher(load_tokenizers(config.tokenizers), feeds,
                                   config.max_blocks, config.key_blocks)
    state.pipeline.use_precise(state.precise)
    for worker_id, endpoints in config.kv_events:
        feeds.ensure(worker_id, static_feed_params(config, endpoints))
    collector = PreciseCollector(feeds)
    state.metrics.registry.register(collector)
    yield
    state.metrics.registry.unregister(collector)
    await feeds.close()
    state.pipeline.use_precise(None)
    state.precise = None
