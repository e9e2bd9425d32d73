"""The picker's app: the router's own (state, discovery, health, /metrics) plus ext_proc."""

from __future__ import annotations

from aiohttp import web

from router.config import RouterConfig
from router.epp.kube import inference_pool_ctx
from router.epp.server import epp_ctx
from router.server.app import build_app


def build_picker_app(config: RouterConfig) -> web.Application:
    app = build_app(config)
    app.cleanup_ctx.append(inference_pool_ctx)  # the pool's pods join before the first pick
    app.cleanup_ctx.append(epp_ctx)
    return app
