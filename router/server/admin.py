"""Admin API: inspect and change the worker pool. Off unless an admin token is configured."""

from __future__ import annotations

import hmac

import orjson
from aiohttp import web

from router.server.errors import error_response
from router.server.state import ROUTER


def _authorised(request: web.Request) -> web.Response | None:
    token = request.app[ROUTER].config.admin_token
    if not token:
        return error_response(404, "admin API is disabled (set PREFIX_ROUTER_ADMIN_TOKEN)",
                              "admin_disabled")
    given = request.headers.get("Authorization", "")
    if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
        return error_response(401, "admin API needs 'Authorization: Bearer <token>'",
                              "unauthorized")
    return None


async def list_workers(request: web.Request) -> web.Response:
    if (denied := _authorised(request)) is not None:
        return denied
    workers = [w.describe() for w in request.app[ROUTER].pool]
    return web.Response(body=orjson.dumps({"workers": workers}), content_type="application/json")


async def add_worker(request: web.Request) -> web.Response:
    if (denied := _authorised(request)) is not None:
        return denied
    state = request.app[ROUTER]
    try:
        spec = orjson.loads(await request.read())
        url = str(spec["url"]).rstrip("/")
        worker_id = str(spec.get("id") or f"w{len(state.pool)}")
        models = frozenset(str(m) for m in spec.get("models", ()))
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        return error_response(400, "body must be {\"url\": ..., \"id\"?: ..., \"models\"?: [...]}",
                              "invalid_worker")
    if not url.startswith(("http://", "https://")):
        return error_response(400, f"{url!r} is not an http(s) URL", "invalid_worker")
    if state.pool.get(worker_id) is not None:
        return error_response(409, f"worker {worker_id!r} exists", "worker_exists")
    worker = state.pool.add(state.new_worker(worker_id, url, "admin", models))
    if state.health is not None:
        await state.health.check(worker)
    return web.Response(status=201, body=orjson.dumps(worker.describe()),
                        content_type="application/json")


async def remove_worker(request: web.Request) -> web.Response:
    if (denied := _authorised(request)) is not None:
        return denied
    state = request.app[ROUTER]
    # the pool runs the removal hooks (router/server/pool_hooks.py)
    if state.pool.remove(request.match_info["worker_id"]) is None:
        return error_response(404, "no such worker", "worker_not_found")
    return web.Response(status=204)


async def drain_worker(request: web.Request) -> web.Response:
    if (denied := _authorised(request)) is not None:
        return denied
    worker = request.app[ROUTER].pool.get(request.match_info["worker_id"])
    if worker is None:
        return error_response(404, "no such worker", "worker_not_found")
    worker.set_serving(draining=True)
    return web.Response(body=orjson.dumps(worker.describe()), content_type="application/json")


def add_routes(app: web.Application) -> None:
    app.router.add_get("/admin/workers", list_workers)
    app.router.add_post("/admin/workers", add_worker)
    app.router.add_delete("/admin/workers/{worker_id}", remove_worker)
    app.router.add_post("/admin/workers/{worker_id}/drain", drain_worker)
