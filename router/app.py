"""The aiohttp application: routes, per-app state and its background tasks."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from router import admin, handlers
from router.config import RouterConfig
from router.discovery import discovery_ctx
from router.errors import openai_errors
from router.health import HealthChecker
from router.load import load_ctx
from router.metrics import RouterMetrics
from router.precise_ctx import precise_ctx
from router.proxy import Proxy
from router.redis_client import make_client, redis_ctx
from router.request_id import request_ids, stamp_request_id
from router.residency.base import ResidencyStore
from router.residency.memory import MemoryResidency
from router.residency.redis import RedisResidency
from router.routing.pipeline import Pipeline
from router.routing.policies import PolicyKnobs, make_policy
from router.state import ROUTER, RouterState
from router.supervisor import SUPERVISOR, Supervisor, supervisor_ctx
from router.workers import WorkerPool


def build_app(config: RouterConfig) -> web.Application:
    app = web.Application(client_max_size=config.max_body_bytes,
                          middlewares=[request_ids, openai_errors])
    app.on_response_prepare.append(stamp_request_id)
    metrics = RouterMetrics()
    app[SUPERVISOR] = Supervisor(metrics.background_errors)
    redis = make_client(config.redis_url) if config.redis_url else None
    residency: ResidencyStore = MemoryResidency(default_capacity=config.residency_capacity)
    if redis is not None:
        residency = RedisResidency(redis, metrics, key_prefix=config.redis_key_prefix,
                                   ttl_s=config.residency_ttl_s,
                                   timeout_ms=config.redis_timeout_ms,
                                   default_capacity=config.residency_capacity)
    pool = WorkerPool()
    state = RouterState(
        config=config,
        pool=pool,
        pipeline=Pipeline(pool, make_policy(config.policy, _knobs(config)), residency, metrics,
                          block_chars=config.block_chars, max_blocks=config.max_blocks,
                          key_blocks=config.key_blocks,
                          decode_penalty_s=config.decode_penalty_ms / 1000.0),
        residency=residency,
        metrics=metrics,
        redis=redis,
    )
    for worker_id, url in config.workers:
        state.pool.add(state.new_worker(worker_id, url, "static"))
    app[ROUTER] = state
    app.cleanup_ctx.append(supervisor_ctx)  # first in, so last out: no task outlives the app
    app.cleanup_ctx.append(_http_session)
    app.cleanup_ctx.append(redis_ctx)  # closed after the residency store's last flush
    app.cleanup_ctx.append(_residency)
    app.cleanup_ctx.append(_health_checks)
    app.cleanup_ctx.append(precise_ctx)  # before discovery: registry workers get feeds
    app.cleanup_ctx.append(discovery_ctx)  # needs the health checker for new workers
    app.cleanup_ctx.append(load_ctx)
    app.router.add_post("/v1/chat/completions", handlers.chat_completions)
    app.router.add_post("/v1/completions", handlers.completions)
    app.router.add_post("/v1/embeddings", handlers.embeddings)
    app.router.add_get("/v1/models", handlers.list_models)
    app.router.add_get("/health", handlers.health)
    app.router.add_get("/ready", handlers.ready)
    app.router.add_get("/metrics", handlers.metrics)
    admin.add_routes(app)
    return app


def _knobs(config: RouterConfig) -> PolicyKnobs:
    return PolicyKnobs(epsilon=config.bound_epsilon, margin=config.bound_margin,
                       slack_s=config.slack_s, slack_ratio=config.slack_ratio,
                       replicate_cost=config.replicate_cost,
                       replica_idle_s=config.replica_idle_s, min_match=config.min_match,
                       warm_ratio=config.warm_ratio)


async def _http_session(app: web.Application) -> AsyncIterator[None]:
    state = app[ROUTER]
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, enable_cleanup_closed=True)
    state.session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
    state.proxy = Proxy(state.session, state.config, state.metrics)
    yield
    await state.session.close()


async def _residency(app: web.Application) -> AsyncIterator[None]:
    residency = app[ROUTER].residency
    await residency.start()
    yield
    await residency.close()


async def _health_checks(app: web.Application) -> AsyncIterator[None]:
    state = app[ROUTER]
    assert state.session is not None
    state.health = HealthChecker(state.pool, state.session, state.metrics,
                                 state.config.health_interval_s, state.config.health_timeout_s)
    await state.health.check_all()  # know who is up before the first request
    app[SUPERVISOR].start("health", state.health.run)
    yield
    await app[SUPERVISOR].stop("health")
