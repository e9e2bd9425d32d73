"""The picker's gRPC server: Envoy's ExternalProcessor service and gRPC health, on asyncio.

It runs inside the router's aiohttp app (a cleanup context), so the picker shares the
proxy's whole state: pool, discovery, health checks, engine scrapes, residency, metrics
(``/metrics`` on the HTTP port counts the picker's decisions like the proxy's).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import grpc
from aiohttp import web
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from router.epp.exchange import Exchange
from router.epp.observe import OBSERVER_METADATA, Observations
from router.server.state import ROUTER, RouterState

log = logging.getLogger(__name__)
EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"


class Picker(ext_proc_grpc.ExternalProcessorServicer):
    """One ext_proc stream per HTTP request and filter: the picking filter's (each message
    answered in order), or the observer filter's (observability mode: read, not answered)."""

    def __init__(self, state: RouterState) -> None:
        self._state = state
        self._observations = Observations(state.metrics)

    async def Process(self, request_iterator: object,
                      context: grpc.aio.ServicerContext) -> None:
        message = await context.read()
        if message is grpc.aio.EOF:
            return
        if message.observability_mode:
            await self._observations.follow(message, context)
            return
        observer = any(key == OBSERVER_METADATA for key, _ in
                       context.invocation_metadata() or ())
        exchange = Exchange(self._state, self._state.config.epp_fail_open,
                            self._observations, observer)
        try:
            while message is not grpc.aio.EOF:
                for reply in await exchange.handle(message):
                    await context.write(reply)
                message = await context.read()
        finally:
            exchange.data_path_over()


class Health(health_pb2_grpc.HealthServicer):
    """The protocol's health services: liveness always; readiness (and the ext_proc
    service) once a worker can take traffic."""

    def __init__(self, state: RouterState) -> None:
        self._state = state

    async def Check(self, request: health_pb2.HealthCheckRequest,
                    context: grpc.aio.ServicerContext) -> health_pb2.HealthCheckResponse:
        status = health_pb2.HealthCheckResponse
        if request.service == "liveness":
            return status(status=status.SERVING)
        if request.service not in ("", "readiness", EXT_PROC_SERVICE):
            return status(status=status.SERVICE_UNKNOWN)
        ready = self._state.pool.healthy_count() > 0
        return status(status=status.SERVING if ready else status.NOT_SERVING)


async def epp_ctx(app: web.Application) -> AsyncIterator[None]:
    """Serve ext_proc on ``epp_port`` once the pool, health checks and discovery are up."""
    state = app[ROUTER]
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    ext_proc_grpc.add_ExternalProcessorServicer_to_server(Picker(state), server)
    health_pb2_grpc.add_HealthServicer_to_server(Health(state), server)
    bound = server.add_insecure_port(f"{state.config.host}:{state.config.epp_port}")
    await server.start()
    log.info("endpoint picker (ext_proc) listening on %s:%d", state.config.host, bound)
    yield
    await server.stop(grace=5)
