"""Forwarding to workers: original bytes out, bytes streamed back, failover before the first byte.

A non-streamed answer is read whole before the client sees a byte, so any upstream failure
(connect, 5xx, timeout, a cut body) moves it to the next ranked worker and nothing is lost.
A stream is committed to a worker by its first chunk; after that a failure ends it with an
SSE error event. In-flight counts run from dispatch to the last byte, and a client that goes
away cancels the handler (``handler_cancellation``), which closes the upstream connection.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from router.config import RouterConfig
from router.fleet.breaker import BreakerState
from router.fleet.workers import Worker
from router.infra.metrics import RouterMetrics
from router.routing.accounting import Attempt
from router.routing.candidate import Candidate
from router.server.errors import error_response, sse_error_event

log = logging.getLogger(__name__)

HOP_BY_HOP = frozenset({
    "host", "content-length", "connection", "keep-alive", "transfer-encoding", "te", "trailer",
    "upgrade", "proxy-authorization", "proxy-authenticate", "x-context-hash",
})
RESPONSE_SKIP = frozenset({"content-length", "connection", "keep-alive", "transfer-encoding",
                           "date", "server"})


class UpstreamFailure(Exception):
    """A try that failed before the client saw a byte; ``status`` is what the client gets."""

    def __init__(self, status: int, message: str, cause: str) -> None:
        super().__init__(message)
        self.status = status
        self.cause = cause


@dataclass(slots=True)
class Outcome:
    response: web.StreamResponse
    worker: Worker | None
    attempts: list[Attempt] = field(default_factory=list)


class Proxy:
    def __init__(self, session: aiohttp.ClientSession, config: RouterConfig,
                 metrics: RouterMetrics) -> None:
        self._session = session
        self._config = config
        self._metrics = metrics
        self._timeout = aiohttp.ClientTimeout(total=None, connect=config.connect_timeout_s,
                                              sock_read=config.idle_timeout_s)

    async def forward(self, request: web.Request, path: str, body: bytes,
                      ranked: Sequence[Candidate], stream: bool, request_id: str,
                      reason: str, begin: Callable[[Candidate], Attempt],
                      worker_headers: Mapping[str, Mapping[str, str]] | None = None
                      ) -> Outcome:
        """Try the ranked workers in turn, each as an Attempt from ``begin`` (the routing
        pipeline's cost accounting); ``worker_headers`` adds per-worker reply headers."""
        headers = filtered_headers(request.headers, HOP_BY_HOP, {"X-Request-Id": request_id})
        failure = UpstreamFailure(503, "no worker could take the request", "none")
        tries = ranked[: self._config.retry_attempts]
        done: list[Attempt] = []
        for attempt, candidate in enumerate(tries):
            worker = candidate.worker
            if attempt:
                self._metrics.retries.labels(failure.cause).inc()
                await asyncio.sleep(self._config.retry_backoff_s * attempt * random.random())
            reply = {"X-Request-Id": request_id}
            if self._config.router_headers:
                reply["X-Prefix-Router-Worker"] = worker.id
                reply["X-Prefix-Router-Reason"] = reason if attempt == 0 else "failover"
            if worker_headers and worker.id in worker_headers:
                reply.update(worker_headers[worker.id])
            tried = begin(candidate)
            done.append(tried)
            try:
                response = await self._try(request, tried, path, body, headers, stream, reply,
                                           request_id)
                return Outcome(response, worker, done)
            except UpstreamFailure as exc:
                log.warning("worker %s failed (%s): %s", worker.id, exc.cause, exc,
                            extra={"request_id": request_id, "worker": worker.id})
                failure = exc
        response = error_response(failure.status, str(failure), code=failure.cause,
                                  retry_after=1 if failure.status == 503 else None,
                                  headers={"X-Request-Id": request_id})
        return Outcome(response, None, done)

    async def _try(self, request: web.Request, tried: Attempt, path: str, body: bytes,
                   headers: CIMultiDict[str], stream: bool, reply_headers: dict[str, str],
                   request_id: str) -> web.StreamResponse:
        worker = tried.worker
        worker.in_flight += 1
        worker.routed += 1
        worker.breaker.on_dispatch()
        gauge = self._metrics.in_flight.labels(worker.id)
        gauge.set(worker.in_flight)
        started = time.perf_counter()
        upstream: aiohttp.ClientResponse | None = None
        try:
            try:
                async with asyncio.timeout(self._config.first_byte_timeout_s):
                    upstream = await self._session.post(worker.url + path, data=body,
                                                        headers=headers, timeout=self._timeout)
                    if upstream.status >= 500:
                        text = (await upstream.read())[:500].decode(errors="replace")
                        raise UpstreamFailure(502, f"worker {worker.id} answered "
                                              f"{upstream.status}: {text}", "upstream_5xx")
                    if stream and upstream.status == 200:
                        first = await upstream.content.readany()
                        if not first:
                            raise UpstreamFailure(502, f"worker {worker.id} closed the stream "
                                                  "before its first byte", "upstream_closed")
                    else:
                        first = await upstream.read()
            except TimeoutError:
                raise UpstreamFailure(504, f"worker {worker.id} timed out before its first "
                                      "byte", "upstream_timeout") from None
            except aiohttp.ClientError as exc:
                raise UpstreamFailure(502, f"worker {worker.id} unreachable: {exc!r}",
                                      "upstream_unreachable") from None
            self._metrics.ttfb.labels(path).observe(time.perf_counter() - started)
            worker.breaker.on_success()
            tried.first_byte()
            tried.saw(first)
            reply = filtered_headers(upstream.headers, RESPONSE_SKIP, reply_headers)
            if not (stream and upstream.status == 200):
                return web.Response(status=upstream.status, body=first, headers=reply)
            return await self._relay(request, upstream, first, reply, tried, request_id)
        except UpstreamFailure:
            worker.breaker.on_failure()
            raise
        finally:
            if upstream is not None:
                upstream.close()
            if tried.first_byte_s is None and worker.breaker.state is BreakerState.HALF_OPEN:
                worker.breaker.on_abandoned()  # no-op after on_failure; frees a cancelled probe
            tried.end()
            worker.in_flight -= 1
            gauge.set(worker.in_flight)

    async def _relay(self, request: web.Request, upstream: aiohttp.ClientResponse,
                     first: bytes, headers: CIMultiDict[str], tried: Attempt,
                     request_id: str) -> web.StreamResponse:
        worker = tried.worker
        response = web.StreamResponse(status=upstream.status, headers=headers)
        await response.prepare(request)
        await response.write(first)
        try:
            async for chunk in upstream.content.iter_any():
                tried.saw(chunk)
                await response.write(chunk)
            if not upstream.content.is_eof():
                raise aiohttp.ClientPayloadError("stream ended early")
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("stream from worker %s broke after its first byte: %r", worker.id, exc,
                        extra={"request_id": request_id, "worker": worker.id})
            worker.breaker.on_failure()
            await response.write(sse_error_event(502, f"upstream worker {worker.id} failed "
                                                 f"mid-stream: {exc!r}", "upstream_stream_broken"))
        await response.write_eof()
        return response


def filtered_headers(source: Mapping[str, str], skip: frozenset[str],
                     extra: dict[str, str]) -> CIMultiDict[str]:
    """Copy headers minus ``skip`` (lower-case names), then set ``extra``."""
    headers: CIMultiDict[str] = CIMultiDict(
        (k, v) for k, v in source.items() if k.lower() not in skip)
    headers.update(extra)
    return headers
