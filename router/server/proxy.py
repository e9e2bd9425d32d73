"""Forwarding to workers: original bytes out, bytes streamed back, nothing lost on the way.

A non-streamed answer is read whole before the client sees a byte, so any upstream failure
(connect, 5xx, timeout, a cut body) moves it to the next ranked worker. A stream is
committed to a worker by its first chunk; if it breaks after that (reset, death, idle
timeout) it is continued on the next ranked worker in the same client stream
(router/server/resume.py), or, when it cannot be, ends with an SSE error event. When health
checks or the breaker mark a worker down, its requests stop waiting on it at once: those
without a first byte move to the next worker, its streams are continued elsewhere. In-flight
counts run from dispatch to the last byte of each worker's leg, and a client that goes
away cancels the handler (``handler_cancellation``), which closes the upstream connection.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from router.config import RouterConfig
from router.fleet.breaker import BreakerState
from router.fleet.workers import Worker
from router.infra.metrics import RouterMetrics
from router.routing.accounting import Attempt
from router.routing.candidate import Candidate
from router.server.early_response import EARLY_RESPONSE
from router.server.errors import error_response, sse_error_event, upstream_error_body
from router.server.hedge import HedgeBudget, first_of, hedge_wait_s
from router.server.resume import Resumption, Splice, continuation, resumable

log = logging.getLogger(__name__)

# not forwarded: hop-by-hop headers, and what no longer describes the body sent on (aiohttp
# hands the router the body decoded: a client's gzip is undone, so its Content-Encoding
# would make the worker gunzip JSON; Expect was answered here, the body is already read)
HOP_BY_HOP = frozenset({
    "host", "content-length", "connection", "keep-alive", "transfer-encoding", "te", "trailer",
    "upgrade", "proxy-authorization", "proxy-authenticate", "x-context-hash",
    "content-encoding", "expect",
})
RESPONSE_SKIP = frozenset({"content-length", "connection", "keep-alive", "transfer-encoding",
                           "date", "server"})


class UpstreamFailure(Exception):
    """A try that failed before the client saw a byte; ``status`` is what the client gets."""

    def __init__(self, status: int, message: str, cause: str) -> None:
        super().__init__(message)
        self.status = status
        self.cause = cause


class ClientGone(Exception):
    """The client stopped reading: nothing more to relay, nothing to resume."""


@dataclass(slots=True)
class Outcome:
    response: web.StreamResponse
    worker: Worker | None


@dataclass(slots=True, eq=False)
class Leg:
    """One worker's part of an answer, dispatch to close, with its accounting."""

    tried: Attempt
    upstream: aiohttp.ClientResponse | None = None
    first: bytes = b""
    scope: asyncio.Timeout | None = None  # what ``worker_down`` expires
    lost: bool = False  # its worker was marked down while it ran
    closed: bool = False


class Proxy:
    def __init__(self, session: aiohttp.ClientSession, config: RouterConfig,
                 metrics: RouterMetrics) -> None:
        self._session = session
        self._config = config
        self._metrics = metrics
        self._timeout = aiohttp.ClientTimeout(total=None, connect=config.connect_timeout_s,
                                              sock_read=config.idle_timeout_s)
        self._urls: dict[tuple[str, str], URL] = {}  # parsed once, not per request
        self._legs: dict[str, set[Leg]] = {}  # live legs by worker id
        self._hedges = HedgeBudget(config.hedge_share) if config.hedge_share > 0 else None

    def _url(self, base: str, path: str) -> URL:
        url = self._urls.get((base, path))
        if url is None:
            if len(self._urls) > 4096:  # workers come and go: keep it bounded
                self._urls.clear()
            url = self._urls[(base, path)] = URL(base + path)
        return url

    def worker_down(self, worker: Worker) -> None:
        """Health checks or the breaker gave up on ``worker`` (a WorkerPool ``on_down``
        hook): every leg on it stops waiting now rather than at its timeout."""
        legs = self._legs.get(worker.id)
        if not legs:
            return
        now = asyncio.get_running_loop().time()
        for leg in legs:
            leg.lost = True
            if leg.scope is not None and not leg.scope.expired():
                leg.scope.reschedule(now)

    async def forward(self, request: web.Request, path: str, body: bytes,
                      ranked: Sequence[Candidate], stream: bool, request_id: str,
                      reason: str, begin: Callable[[Candidate], Attempt],
                      done: list[Attempt],
                      worker_headers: Mapping[str, Mapping[str, str]] | None = None,
                      payload: Mapping[str, Any] | None = None,
                      method: str = "POST") -> Outcome:
        """Try the ranked workers in turn, each as an Attempt from ``begin`` (the routing
        pipeline's cost accounting), appended to ``done``: the caller's list, which it
        still holds when the client's leaving cancels this call; ``worker_headers`` adds
        per-worker reply headers; ``payload`` (the parsed body) lets a broken stream be
        resumed."""
        headers = filtered_headers(request.headers, HOP_BY_HOP, {"X-Request-Id": request_id})
        failure = UpstreamFailure(503, "no worker could take the request", "none")
        tries = ranked[: self._config.retry_attempts]
        if self._hedges is not None:
            self._hedges.on_request()
        for attempt, candidate in enumerate(tries):
            if attempt:
                if not candidate.worker.routable() or any(a.candidate is candidate
                                                          for a in done):
                    continue  # marked down since the ranking, or tried as a hedge
                self._metrics.retries.labels(failure.cause).inc()
                await asyncio.sleep(self._config.retry_backoff_s * attempt * random.random())
            tried = begin(candidate)
            done.append(tried)
            try:
                if attempt == 0 and self._hedges is not None:
                    leg = await self._open_hedged(tried, tries[1:], path, body, headers,
                                                  stream, method, begin, done)
                else:
                    leg = await self._open(tried, path, body, headers, stream, method)
            except UpstreamFailure as exc:
                log.warning("worker %s failed (%s): %s", candidate.id, exc.cause, exc,
                            extra={"request_id": request_id, "worker": candidate.id})
                failure = exc
                continue
            worker = leg.tried.worker
            reply = {"X-Request-Id": request_id}
            if self._config.router_headers:
                reply["X-Prefix-Router-Worker"] = worker.id
                reply["X-Prefix-Router-Reason"] = (
                    "failover" if attempt else "hedge" if leg.tried is not tried else reason)
            if worker_headers and worker.id in worker_headers:
                reply.update(worker_headers[worker.id])
            assert leg.upstream is not None
            status = leg.upstream.status
            reply_headers = filtered_headers(leg.upstream.headers, RESPONSE_SKIP, reply)
            if not (stream and status == 200):
                body = leg.first
                if status >= 400 and (shaped := upstream_error_body(status, body)) is not None:
                    body = shaped
                    reply_headers["Content-Type"] = "application/json"
                return Outcome(web.Response(status=status, body=body,
                                            headers=reply_headers), worker)
            resume = None
            if payload is not None and self._config.stream_resumes > 0:
                chat = path.endswith("/chat/completions")
                if resumable(payload, chat):
                    resume = Resumption(payload, chat, ranked, self._config.stream_resumes)
            response = await self._stream(request, leg, reply_headers, request_id, resume,
                                          _Continue(path, headers, begin, done))
            return Outcome(response, worker)
        response = error_response(failure.status, str(failure), code=failure.cause,
                                  retry_after=1 if failure.status == 503 else None,
                                  headers={"X-Request-Id": request_id})
        return Outcome(response, None)

    async def _open_hedged(self, tried: Attempt, spares: Sequence[Candidate], path: str,
                           body: bytes, headers: CIMultiDict[str], stream: bool, method: str,
                           begin: Callable[[Candidate], Attempt], done: list[Attempt]) -> Leg:
        """The first try, hedged to the next routable worker when its first byte is late
        against its predicted TTFT (router/server/hedge.py); the winner's leg."""
        assert self._hedges is not None
        hedges = self._hedges
        spare = next((c for c in spares if c.worker.routable()), None)
        predicted = tried.candidate.ttft_s
        if spare is None or predicted <= 0:
            return await self._open(tried, path, body, headers, stream, method)

        def hedge() -> Awaitable[Leg] | None:
            if not spare.worker.routable() or not hedges.take():
                return None
            second = begin(spare)
            done.append(second)
            self._metrics.hedges.labels("sent").inc()
            return self._open(second, path, body, headers, stream, method)

        leg, won = await first_of(self._open(tried, path, body, headers, stream, method),
                                  hedge_wait_s(predicted, self._config.hedge_factor), hedge)
        if won:
            self._metrics.hedges.labels("won").inc()
        return leg

    # -- one leg: dispatch to first byte, close ----------------------------------------
    async def _open(self, tried: Attempt, path: str, body: bytes, headers: CIMultiDict[str],
                    stream: bool, method: str = "POST") -> Leg:
        """Dispatch to ``tried.worker`` and wait for its first byte (its whole body when not
        streamed); a failure closes the leg and raises UpstreamFailure."""
        worker = tried.worker
        leg = Leg(tried)
        worker.begin()
        worker.routed += 1
        worker.breaker.on_dispatch()
        self._metrics.child(self._metrics.in_flight, worker.id).set(worker.in_flight)
        self._legs.setdefault(worker.id, set()).add(leg)
        started = time.perf_counter()
        try:
            try:
                async with asyncio.timeout(self._config.first_byte_timeout_s) as scope:
                    leg.scope = scope
                    try:
                        upstream = await self._first_byte(leg, path, body, headers, stream,
                                                          method)
                    finally:
                        leg.scope = None  # before the scope ends: it cannot expire after
            except TimeoutError:
                if leg.lost:
                    raise UpstreamFailure(503, f"worker {worker.id} was marked down before "
                                          "its first byte", "worker_down") from None
                raise UpstreamFailure(504, f"worker {worker.id} timed out before its first "
                                      "byte", "upstream_timeout") from None
            except aiohttp.ClientError as exc:
                raise UpstreamFailure(502, f"worker {worker.id} unreachable: {exc!r}",
                                      "upstream_unreachable") from None
        except UpstreamFailure:
            self._close(leg)
            self._failed(worker)
            raise
        except BaseException:
            self._close(leg)
            raise
        self._metrics.child(self._metrics.ttfb, path).observe(time.perf_counter() - started)
        worker.breaker.on_success()
        tried.first_byte()
        tried.saw(leg.first)
        if not (stream and upstream.status == 200):
            self._close(leg)
        return leg

    async def _first_byte(self, leg: Leg, path: str, body: bytes, headers: CIMultiDict[str],
                          stream: bool, method: str) -> aiohttp.ClientResponse:
        await leg.tried.cleared()  # the prefill gate; a worker marked down expires it too
        worker = leg.tried.worker
        if worker.api_key is not None:  # its own key replaces the client's (never logged)
            headers = headers.copy()
            headers["Authorization"] = f"Bearer {worker.api_key}"
        leg.upstream = upstream = await self._session.request(
            method, self._url(worker.url, path), data=body, headers=headers, timeout=self._timeout)
        if upstream.status >= 500:
            text = (await upstream.read())[:500].decode(errors="replace")
            raise UpstreamFailure(502, f"worker {worker.id} answered {upstream.status}: "
                                  f"{text}", "upstream_5xx")
        if stream and upstream.status == 200:
            leg.first = await upstream.content.readany()
            if not leg.first:
                raise UpstreamFailure(502, f"worker {worker.id} closed the stream before its "
                                      "first byte", "upstream_closed")
        else:
            leg.first = await upstream.read()
        return upstream

    def _close(self, leg: Leg) -> None:
        if leg.closed:
            return
        leg.closed = True
        tried, worker = leg.tried, leg.tried.worker
        if leg.upstream is not None:
            leg.upstream.close()
        if tried.first_byte_s is None and worker.breaker.state is BreakerState.HALF_OPEN:
            worker.breaker.on_abandoned()  # no-op after on_failure; frees a cancelled probe
        tried.end()
        worker.finish()
        self._metrics.child(self._metrics.in_flight, worker.id).set(worker.in_flight)
        legs = self._legs.get(worker.id)
        if legs is not None:
            legs.discard(leg)
            if not legs:
                del self._legs[worker.id]

    def _failed(self, worker: Worker) -> None:
        """A failure on ``worker``; if it opens the breaker, the worker's other legs move."""
        was_open = worker.breaker.state is BreakerState.OPEN
        worker.breaker.on_failure()
        if not was_open and worker.breaker.state is BreakerState.OPEN:
            self.worker_down(worker)

    # -- a stream: legs relayed into one client response ---------------------------------
    async def _stream(self, request: web.Request, leg: Leg, headers: CIMultiDict[str],
                      request_id: str, resume: Resumption | None, more: _Continue
                      ) -> web.StreamResponse:
        response = request.get(EARLY_RESPONSE)  # a queued stream already answered
        if response is None:
            response = web.StreamResponse(status=200, headers=headers)
            await response.prepare(request)
        splice: Splice | None = None
        try:
            while True:
                broke = await self._pump(response, leg, resume, splice, request_id)
                self._close(leg)
                if broke is None:
                    break
                if resume is not None:
                    resume.broken.add(leg.tried.worker.id)
                nxt = await self._resume(resume, more, request_id) if resume else None
                if nxt is None:
                    if resume is None or not (resume.seen.done or resume.seen.finished):
                        await response.write(sse_error_event(
                            502, f"upstream worker {leg.tried.worker.id} failed mid-stream: "
                            f"{broke!r}", "upstream_stream_broken"))
                    elif not resume.seen.done:
                        await response.write(b"data: [DONE]\n\n")
                    break
                leg, splice = nxt
            try:
                await response.write_eof()
            except ConnectionResetError:  # the client left at [DONE], racing the body's end
                raise ClientGone from None  # (seen in the live bench's router logs)
        except ClientGone:
            pass
        finally:
            self._close(leg)
        return response

    async def _pump(self, response: web.StreamResponse, leg: Leg, resume: Resumption | None,
                    splice: Splice | None, request_id: str) -> Exception | None:
        """Relay one leg to the client; the failure that broke it, or None at its end."""
        assert leg.upstream is not None
        worker = leg.tried.worker
        try:
            async with asyncio.timeout(None) as scope:
                leg.scope = scope
                try:
                    if leg.lost:
                        scope.reschedule(asyncio.get_running_loop().time())
                    await _write(response, leg.first, resume, splice)
                    async for chunk in leg.upstream.content.iter_any():
                        leg.tried.saw(chunk)
                        await _write(response, chunk, resume, splice)
                    if not leg.upstream.content.is_eof():
                        raise aiohttp.ClientPayloadError("stream ended early")
                finally:
                    leg.scope = None  # before the scope ends: it cannot expire after
        except (aiohttp.ClientError, TimeoutError) as exc:
            cause = "marked down" if leg.lost else repr(exc)
            log.warning("stream from worker %s broke after its first byte: %s", worker.id,
                        cause, extra={"request_id": request_id, "worker": worker.id})
            if not leg.lost:
                self._failed(worker)
            return exc
        rest = splice.rest() if splice else resume.seen.rest() if resume else b""
        if rest:
            await _write(response, rest, None, None)
        return None

    async def _resume(self, resume: Resumption, more: _Continue, request_id: str
                      ) -> tuple[Leg, Splice] | None:
        """The next worker's leg continuing what the client has, or None."""
        seen = resume.seen
        seen.fold()
        if seen.done or seen.finished:
            self._metrics.stream_resumes.labels("complete").inc()
            return None
        if (refusal := resume.refusal()) is not None:
            self._metrics.stream_resumes.labels(refusal).inc()
            return None
        body = continuation(resume.payload, resume.chat, seen)
        if body is None:  # max_tokens reached: the answer is whole
            seen.finished = True
            self._metrics.stream_resumes.labels("complete").inc()
            return None
        data = orjson.dumps(body)
        for candidate in resume.candidates()[: self._config.retry_attempts]:
            tried = more.begin(candidate)
            more.done.append(tried)
            try:
                leg = await self._open(tried, more.path, data, more.headers, stream=True)
            except UpstreamFailure as exc:
                log.warning("resume on worker %s failed (%s): %s", candidate.id, exc.cause,
                            exc, extra={"request_id": request_id, "worker": candidate.id})
                resume.broken.add(candidate.id)
                continue
            assert leg.upstream is not None
            if leg.upstream.status != 200:
                self._close(leg)
                resume.broken.add(candidate.id)
                continue
            resume.resumes += 1
            self._metrics.stream_resumes.labels("resumed").inc()
            log.info("stream resumed on worker %s after %d chunks", candidate.id,
                     seen.produced, extra={"request_id": request_id, "worker": candidate.id})
            return leg, Splice(seen)
        self._metrics.stream_resumes.labels("no_worker").inc()
        return None


@dataclass(slots=True, frozen=True)
class _Continue:
    """What a resume needs of the original request to dispatch a continuation."""

    path: str
    headers: CIMultiDict[str]
    begin: Callable[[Candidate], Attempt]
    done: list[Attempt]


async def _write(response: web.StreamResponse, chunk: bytes, resume: Resumption | None,
                 splice: Splice | None) -> None:
    """Relay ``chunk``: a continuation's rewritten, a resumable stream's whole events only."""
    if splice is not None and resume is not None:
        chunk = splice.rewrite(chunk)
        resume.seen.relayed(chunk)
    elif resume is not None:
        chunk = resume.seen.feed(chunk)
    if chunk:
        try:
            await response.write(chunk)
        except ConnectionResetError as exc:  # aiohttp's ClientConnectionResetError too
            raise ClientGone from exc


def filtered_headers(source: Mapping[str, str], skip: frozenset[str],
                     extra: dict[str, str]) -> CIMultiDict[str]:
    """Copy headers minus ``skip`` (lower-case names), then set ``extra``. A multidict is
    copied and trimmed in C (one copy, a ``popall`` per name) rather than rebuilt from a
    Python loop that lower-cases every name."""
    if isinstance(source, (CIMultiDict, CIMultiDictProxy)):
        headers = source.copy()
        for name in skip:
            headers.popall(name, None)
    else:
        headers = CIMultiDict((k, v) for k, v in source.items() if k.lower() not in skip)
    headers.update(extra)
    return headers
