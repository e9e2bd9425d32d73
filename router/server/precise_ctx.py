"""Wiring of precise mode into the app: tokenizers, the exact residency, KV-event feeds.

Feeds follow the pool through its hooks (router/server/pool_hooks.py): a worker added with
``kv_events`` is subscribed, a removed one is unsubscribed; static workers' feeds
(``--kv-events``) are subscribed here at start-up, as precise mode starts after the pool;
other static and admin-added workers are asked for theirs (server/kv_sources.py).

Kept out of router/precise/ so that package stays free of aiohttp app concerns, and out of
app.py so the router imports ZMQ and transformers only when ``--tokenizers`` is set.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from aiohttp import web

from router.config import RouterConfig
from router.infra.supervisor import SUPERVISOR
from router.protocol.registry import WorkerRecord
from router.server.state import ROUTER

if TYPE_CHECKING:
    from router.protocol.kv_feed import FeedParams


def static_feed_params(config: RouterConfig, endpoints: str) -> FeedParams:
    """'EVENTS_URL[|REPLAY_URL]' of a static worker -> its FeedParams."""
    from router.protocol.kv_feed import FeedParams

    events, _, replay = endpoints.partition("|")
    return FeedParams(events, replay or None, config.kv_events_topic,
                      config.precise_block_size, config.precise_hash_seed)


def record_feed_params(record: WorkerRecord) -> FeedParams | None:
    """A registry worker's advertised KV events, or None if it publishes none."""
    from router.protocol.kv_feed import FeedParams

    if not record.kv_events_endpoint or record.extra.get("hash_algo", "sha256_cbor") \
            != "sha256_cbor":
        return None
    return FeedParams(record.kv_events_endpoint,
                      record.extra.get("kv_events_replay_endpoint") or None,
                      record.extra.get("kv_events_topic", "kv-events"), record.block_size,
                      str(record.extra.get("hash_seed", "0")))


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
        params = static_feed_params(config, endpoints)
        if (worker := state.pool.get(worker_id)) is not None:
            worker.kv_events = params
        feeds.ensure(worker_id, params)
    supervisor = app[SUPERVISOR]
    if state.session is not None:  # the others name their feeds: GET /kv_event_sources
        from router.server.kv_sources import KVSourceDiscovery

        sources = KVSourceDiscovery(state, state.session, feeds)
        await sources.poll()  # static workers healthy at start are followed before serving
        supervisor.start("kv-sources", sources.run)
    collector = PreciseCollector(feeds)
    state.metrics.registry.register(collector)
    yield
    state.metrics.registry.unregister(collector)
    await supervisor.stop("kv-sources")
    await feeds.close()
    state.pipeline.use_precise(None)
    state.precise = None
