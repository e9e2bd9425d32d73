"""The aiohttp application: routes, per-app state and its background tasks."""

from __future__ import annotations

from aiohttp import web

from router.config import RouterConfig
from router.fleet.workers import WorkerPool
from router.infra.metrics import RouterMetrics
from router.infra.redis_client import make_client
from router.infra.supervisor import SUPERVISOR, Supervisor, supervisor_ctx
from router.residency.base import ChainShape, ResidencyStore
from router.residency.memory import MemoryResidency
from router.residency.redis import RedisResidency
from router.routing.keys import TAIL_FACTOR
from router.routing.pipeline import Pipeline
from router.routing.policies import PolicyKnobs, make_policy
from router.server import admin, handlers, openapi, passthrough, responses, route_trace
from router.server.admission_edge import admission_ctx
from router.server.contexts import (
    health_checks_ctx,
    http_session_ctx,
    load_ctx,
    redis_ctx,
    residency_ctx,
    snapshot_ctx,
)
from router.server.discovery import discovery_ctx
from router.server.edge import body_deadline
from router.server.errors import openai_errors
from router.server.lora_loader import LORA_LOADER, LoraLoader
from router.server.precise_ctx import precise_ctx
from router.server.request_id import request_ids, stamp_request_id
from router.server.response_owners import RESPONSE_OWNERS, ResponseOwners, response_owners_ctx
from router.server.state import ROUTER, RouterState
from router.server.upstream import load_upstream


def build_app(config: RouterConfig) -> web.Application:
    app = web.Application(client_max_size=config.max_body_bytes,
                          middlewares=[request_ids, openai_errors,
                                       body_deadline(config.client_timeout_s)])
    app.on_response_prepare.append(stamp_request_id)
    route_trace.install(app, config)
    metrics = RouterMetrics()
    app[SUPERVISOR] = Supervisor(metrics.background_errors)
    redis = make_client(config.redis_url) if config.redis_url else None
    shape = ChainShape(config.max_blocks, TAIL_FACTOR)
    residency: ResidencyStore = MemoryResidency(config.residency_capacity, shape)
    if redis is not None:
        residency = RedisResidency(redis, metrics, key_prefix=config.redis_key_prefix,
                                   ttl_s=config.residency_ttl_s,
                                   timeout_ms=config.redis_timeout_ms,
                                   default_capacity=config.residency_capacity, shape=shape)
    pool = WorkerPool()
    upstream = load_upstream(config)  # read now: a bad file fails the start, not a request
    state = RouterState(
        config=config,
        pool=pool,
        pipeline=Pipeline(pool, make_policy(config.policy, PolicyKnobs.of(config)), residency,
                          metrics,
                          block_chars=config.block_chars, max_blocks=config.max_blocks,
                          key_blocks=config.key_blocks,
                          decode_penalty_s=config.decode_penalty_ms / 1000.0,
                          attention_tokens=config.attention_tokens,
                          offload_weight=config.offload_weight,
                          shortlist_size=config.shortlist_size,
                          prefill_gate_s=config.prefill_gate_ms / 1000.0,
                          chunk_tokens=config.prefill_chunk_tokens),
        residency=residency,
        metrics=metrics,
        redis=redis,
        upstream_keys=upstream.keys,
        upstream_ssl=upstream.ssl,
    )
    for worker_id, url in config.workers:
        state.pool.add(state.new_worker(worker_id, url, "static"))
    app[ROUTER] = state
    if config.lora_adapters:
        app[LORA_LOADER] = LoraLoader(dict(config.lora_adapters), pool)
    app[RESPONSE_OWNERS] = ResponseOwners(redis, config.redis_key_prefix, config.responses_ttl_s)
    app.cleanup_ctx.append(supervisor_ctx)  # first in, so last out: no task outlives the app
    app.cleanup_ctx.append(http_session_ctx)
    app.cleanup_ctx.append(redis_ctx)  # closed after the residency store's last flush
    app.cleanup_ctx.append(response_owners_ctx)  # and after the owners' last writes
    app.cleanup_ctx.append(residency_ctx)
    app.cleanup_ctx.append(snapshot_ctx)  # saved before the store closes
    app.cleanup_ctx.append(health_checks_ctx)
    app.cleanup_ctx.append(precise_ctx)  # before discovery: registry workers get feeds
    app.cleanup_ctx.append(discovery_ctx)  # needs the health checker for new workers
    app.cleanup_ctx.append(load_ctx)
    app.cleanup_ctx.append(admission_ctx)  # after load: its tick reads the scraped queues
    app.router.add_post("/v1/chat/completions", handlers.chat_completions)
    app.router.add_post("/v1/completions", handlers.completions)
    app.router.add_post("/v1/embeddings", handlers.embeddings)
    app.router.add_get("/v1/models", handlers.list_models)
    app.router.add_post("/v1/responses", responses.create)
    app.router.add_get("/v1/responses/{response_id}", responses.retrieve)
    app.router.add_post("/v1/responses/{response_id}/cancel", responses.cancel)
    passthrough.add_routes(app)
    app.router.add_get("/health", handlers.health)
    app.router.add_get("/ready", handlers.ready)
    app.router.add_get("/metrics", handlers.metrics)
    admin.add_routes(app)
    openapi.add_route(app)
    return app

