"""The app's resources, each created and disposed in its own cleanup context.

``build_app`` (app.py) only composes; what starts and stops, and in which order, is here.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from router.fleet.health import HealthChecker
from router.fleet.load import LoadSharer, LoadView, Scraper
from router.infra.supervisor import SUPERVISOR
from router.residency.memory import MemoryResidency
from router.residency.snapshot import ResidencySnapshot
from router.server.proxy import Proxy
from router.server.state import ROUTER

log = logging.getLogger(__name__)


async def http_session_ctx(app: web.Application) -> AsyncIterator[None]:
    state = app[ROUTER]
    # one trust for every request to a worker: proxied, probes, scrapes (server/upstream.py)
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, enable_cleanup_closed=True,
                                     ssl=state.upstream_ssl or True)
    # no cookie jar: a worker's Set-Cookie must reach its client, not be replayed on every
    # later client's requests to that worker (and filtering a jar costs on every request)
    state.session = aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                          cookie_jar=aiohttp.DummyCookieJar())
    state.proxy = Proxy(state.session, state.config, state.metrics)
    state.pool.on_down.append(state.proxy.worker_down)
    yield
    await state.session.close()


async def residency_ctx(app: web.Application) -> AsyncIterator[None]:
    residency = app[ROUTER].residency
    await residency.start()
    yield
    await residency.close()


async def snapshot_ctx(app: web.Application) -> AsyncIterator[None]:
    """Without Redis, load the residency saved by the last run, save it periodically and on
    shutdown (router/residency/snapshot.py says why). Redis keeps the picture itself."""
    state = app[ROUTER]
    path = state.config.residency_snapshot
    if not path or not isinstance(state.residency, MemoryResidency):
        yield
        return
    snapshot = ResidencySnapshot(state.residency, path, state.config.residency_snapshot_ttl_s)
    snapshot.load()
    supervisor = app[SUPERVISOR]
    supervisor.start("residency-snapshot",
                     lambda: snapshot.run(state.config.residency_snapshot_interval_s))
    yield
    await supervisor.stop("residency-snapshot")
    try:
        await snapshot.save()
    except OSError as exc:
        log.warning("residency snapshot not saved: %s", exc)


async def health_checks_ctx(app: web.Application) -> AsyncIterator[None]:
    state = app[ROUTER]
    assert state.session is not None
    state.health = HealthChecker(state.pool, state.session, state.metrics,
                                 state.config.health_interval_s, state.config.health_timeout_s)
    await state.health.check_all()  # know who is up before the first request
    app[SUPERVISOR].start("health", state.health.run)
    yield
    await app[SUPERVISOR].stop("health")


async def redis_ctx(app: web.Application) -> AsyncIterator[None]:
    """Close the shared client last (after the residency store's final flush)."""
    yield
    client = app[ROUTER].redis
    if client is not None:
        await client.aclose()


async def load_ctx(app: web.Application) -> AsyncIterator[None]:
    """Scrape engines (``scrape_interval_s`` > 0) and share load through Redis (when set)."""
    state = app[ROUTER]
    view = LoadView(state)
    supervisor = app[SUPERVISOR]
    sharer: LoadSharer | None = None
    if state.redis is not None:
        sharer = LoadSharer(state, state.redis, view, state.replica_id)
        supervisor.start("load-sharer", sharer.run)
    if state.config.scrape_interval_s > 0 and state.session is not None:
        supervisor.start("scraper", Scraper(state, state.session, view).run)
    yield
    await supervisor.stop("scraper")
    await supervisor.stop("load-sharer")
    if sharer is not None:
        await sharer.withdraw()
