"""One HTTP request through the gateway, as the picker sees it over its ext_proc stream.

request headers -> request body: decide (router/server/decide.py, as the proxy does) and
answer with the ranked endpoints; the primary's Attempt starts (pending prefill). With a
BUFFERED body (the shipped config) Envoy waits for the headers' answer before it sends the
body. A gateway that streams the body without waiting for it
(``send_body_without_waiting_for_header_response``) gets no answer to the headers until
the body's last chunk: then the pick goes in that answer (Envoy has not routed yet),
followed by one per chunk. One round trip before the request leaves instead of two; side by
side on the RAG replay the two were equal (bench/README.md), so the shipped config keeps
the simpler one.
response headers: which endpoint served (a fallback when the primary failed before its
first byte: the primary's try ends as a failure, the fallback's begins) and its status.
response body, in line (the picking filter streams it) or observed (Envoy's observer
filter sends it on a stream of its own, router/epp/observe.py, without waiting): the first
chunk is the first byte (residency recorded, pending -> decoding), each chunk is scanned
for usage, the last ends the try; ``pipeline.complete`` learns from it exactly as after a
proxied request. With neither (lean) the response headers are the first byte.
``data_path_over`` runs whatever way the picking stream ends (the request is over, or the
client went away): it ends the exchange, or, while an observation is still due, gives it
``--epp-observe-grace-s`` more, so a lagging or lost observation delays the accounting's
end, never leaks phantom load.
"""

from __future__ import annotations

import asyncio
import logging
import time

from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc

from router.client.contract import CONTEXT_HASH_HEADER, REASON_HEADER, WORKER_HEADER
from router.epp import protocol
from router.epp.observe import Observations
from router.routing.accounting import Attempt
from router.routing.candidate import Candidate
from router.routing.errors import Rejected
from router.routing.policies.base import Decision
from router.routing.request import RoutingRequest
from router.server.decide import NO_KEY, PROMPT_READERS, address, decide, prediction_headers
from router.server.errors import error_body
from router.server.state import RouterState

log = logging.getLogger(__name__)
Reply = ext_proc.ProcessingResponse


class Exchange:
    def __init__(self, state: RouterState, fail_open: bool, observations: Observations,
                 observer: bool) -> None:
        """``observer``: the gateway declared an observer filter for response bodies."""
        self._state = state
        self._fail_open = fail_open
        self._observations = observations
        self._observed = observer  # the body will come on an observer stream
        self._exchange_id = ""
        self._grace: asyncio.TimerHandle | None = None
        self._started = time.perf_counter()
        self._path = ""
        self._context_hash: str | None = None
        self._request_id = ""
        self._body: list[bytes] = []
        self._routing = RoutingRequest(NO_KEY, 0.0, 1.0, None, source="none")
        self._subset: list[str] | None = None
        self._ranked: list[Candidate] = []
        self._reason = "none"
        self._attempts: list[Attempt] = []
        self._status = 0
        self._headers_at: float | None = None  # when the response headers came
        self._closed = False
        self._inline = True  # response body chunks come on this stream
        # the headers' answer waits for the body (Envoy sends the body without waiting for
        # it): one round trip to the picker before the request leaves, not two
        self._hold_headers = False

    async def handle(self, message: ext_proc.ProcessingRequest) -> list[Reply]:
        """The replies to one message, in the order Envoy expects them: one each, or, while
        the headers' answer is held for the body, none until its last chunk, then the
        headers' answer (the pick) and one per chunk."""
        kind = message.WhichOneof("request")
        if message.HasField("protocol_config"):  # the first message says what will follow
            config = message.protocol_config
            self._inline = config.response_body_mode != processing_mode_pb2.ProcessingMode.NONE
            self._observed = self._observed and not self._inline
            self._hold_headers = config.send_body_without_waiting_for_header_response and \
                config.request_body_mode == processing_mode_pb2.ProcessingMode.STREAMED
        if kind == "request_headers":
            return self._request_headers(message)
        if kind == "request_body":
            return await self._request_body(message)
        if kind == "response_headers":
            return [self._response_headers(message)]
        if kind == "response_body":
            return [self._response_body(message.response_body)]
        if kind == "request_trailers":
            return [Reply(request_trailers=ext_proc.TrailersResponse())]
        return [Reply(response_trailers=ext_proc.TrailersResponse())]

    # -- request ---------------------------------------------------------------------
    def _request_headers(self, message: ext_proc.ProcessingRequest) -> list[Reply]:
        headers = protocol.headers(message.request_headers)
        self._path = headers.get(":path", "").split("?", 1)[0]
        self._context_hash = headers.get(CONTEXT_HASH_HEADER.lower())
        self._request_id = headers.get("x-request-id", "")
        self._subset = protocol.subset_hint(message)
        if not message.request_headers.end_of_stream:
            return [] if self._hold_headers else [protocol.CONTINUE_HEADERS]
        return [self._pick_without_body(on_headers=True)]

    async def _request_body(self, message: ext_proc.ProcessingRequest) -> list[Reply]:
        self._body.append(message.request_body.body)
        if not message.request_body.end_of_stream:
            return [] if self._hold_headers else [protocol.CONTINUE_BODY]
        held = self._hold_headers
        if self._path not in PROMPT_READERS:
            return self._with_body(self._pick_without_body(on_headers=held))
        pipeline = self._state.pipeline
        try:
            routed = await decide(pipeline, b"".join(self._body), self._path,
                                  PROMPT_READERS[self._path], self._context_hash, self._subset)
        except Rejected as exc:
            return [self._refuse(exc)]
        except Exception:
            log.exception("picker failed on a request", extra={"request_id": self._request_id})
            if self._fail_open:  # let the gateway's own load balancing place it
                self._state.metrics.decisions.labels(pipeline.policy.name, "fail_open").inc()
                return self._with_body(protocol.CONTINUE_HEADERS if held
                                       else protocol.CONTINUE_BODY)
            return [self._refuse(Rejected(503, "the endpoint picker failed", "picker_error", 1))]
        self._routing = routed.routing
        return self._with_body(self._answer(routed.decision, routed.parsed.stream, held))

    def _with_body(self, reply: Reply) -> list[Reply]:
        """``reply`` (the answer to the body, or to the held headers), then, when the
        headers were held, the answers every body chunk still waits for."""
        chunks = len(self._body)
        self._body.clear()
        if not self._hold_headers or reply.HasField("immediate_response"):
            return [reply]
        return [reply, *([protocol.CONTINUE_BODY] * chunks)]

    def _pick_without_body(self, on_headers: bool) -> Reply:
        """No body this picker keys on (GET /v1/models, another API): the least-loaded
        worker."""
        try:
            pipeline = self._state.pipeline
            candidates = pipeline.routable(pipeline.fleet(None))
        except Rejected as exc:
            return self._refuse(exc)
        if self._subset is not None:
            candidates = [c for c in candidates if address(c.worker.url) in self._subset]
            if not candidates:
                return self._refuse(Rejected(503, "no routable worker in the gateway's "
                                             "endpoint subset", "no_worker_in_subset", 1))
        return self._answer(Decision(sorted(candidates, key=lambda c: c.load), "least_loaded"),
                            False, on_headers)

    def _answer(self, decision: Decision, stream: bool, on_headers: bool) -> Reply:
        tries = decision.ranked[: self._state.config.retry_attempts]
        self._ranked = tries
        self._reason = decision.reason
        self._begin(tries[0], stream)
        if self._observed:
            self._exchange_id = self._observations.open(self)
        return protocol.pick((address(c.worker.url) for c in tries), self._exchange_id,
                             on_headers)

    def _refuse(self, exc: Rejected) -> Reply:
        metrics = self._state.metrics
        metrics.decisions.labels(self._state.pipeline.policy.name, "rejected").inc()
        metrics.requests.labels(self._path, "none", str(exc.status)).inc()
        headers = {"x-request-id": self._request_id} if self._request_id else {}
        if exc.retry_after is not None:
            headers["retry-after"] = str(max(1, round(exc.retry_after)))
        self._closed = True
        return protocol.immediate(exc.status, error_body(exc.status, str(exc), exc.code),
                                  headers)

    # -- response --------------------------------------------------------------------
    def _response_headers(self, message: ext_proc.ProcessingRequest) -> Reply:
        self._headers_at = self._state.pipeline.clock()
        status = protocol.headers(message.response_headers).get(":status", "0")
        self._status = int(status) if status.isdigit() else 0
        served = protocol.served_endpoint(message)
        current = self._attempts[-1] if self._attempts else None
        if current is not None and served is not None and address(current.worker.url) != served:
            # the primary failed before its first byte and the gateway retried a fallback
            current.worker.breaker.on_failure()
            self._state.metrics.retries.labels("gateway_failover").inc()
            self._end(current)
            fallback = next((c for c in self._ranked if address(c.worker.url) == served), None)
            if fallback is not None:
                self._begin(fallback, current.stream)
            current = self._attempts[-1] if fallback is not None else None
        if current is not None:
            if self._status >= 500:
                current.worker.breaker.on_failure()
            else:
                current.worker.breaker.on_success()
        if message.response_headers.end_of_stream or not (self._inline or self._observed):
            self._first_byte()  # no body to wait for: the answer has begun
        if message.response_headers.end_of_stream:
            self.close()
        if current is None or not self._state.config.router_headers:
            return protocol.CONTINUE_RESPONSE_HEADERS
        reason = self._reason if len(self._attempts) <= 1 else "failover"
        return protocol.response_headers({
            WORKER_HEADER: current.worker.id, REASON_HEADER: reason,
            **prediction_headers(current.candidate, self._routing.exact)})

    def _response_body(self, body: ext_proc.HttpBody) -> Reply:
        self._first_byte()
        if self._attempts:
            self._attempts[-1].saw(body.body)
        if body.end_of_stream:
            self.close()
        return protocol.CONTINUE_RESPONSE_BODY

    # -- observed response body (router/epp/observe.py) ------------------------------------
    def observe(self, body: ext_proc.HttpBody) -> None:
        if self._closed:
            return
        if body.end_of_stream:
            self._state.metrics.epp_observations.labels("observed").inc()
        self._response_body(body)

    def observation_over(self) -> None:
        """The observer stream ended, with or without the body's last chunk."""
        if not self._closed:
            self._state.metrics.epp_observations.labels("cut").inc()
        self.close()

    def data_path_over(self) -> None:
        """The picking stream ended: Envoy is done with the request (or the client left)."""
        if self._closed:
            return
        if not self._exchange_id:
            self.close()
            return
        # the observation may still be on its way: the picker reads it behind Envoy
        self._grace = asyncio.get_running_loop().call_later(
            self._state.config.epp_observe_grace_s, self._expire)

    def _expire(self) -> None:
        """No observed end by the grace: end without it. A 2xx was served, so the prompt
        was computed there (residency); if this picker never saw the first chunk, the
        response headers stand for it, as in lean mode."""
        if self._closed:
            return
        self._state.metrics.epp_observations.labels("expired").inc()
        if 200 <= self._status < 300:
            self._first_byte(self._headers_at)
        self.close()

    def _first_byte(self, now: float | None = None) -> None:
        if self._attempts and not self._attempts[-1].ended:
            self._attempts[-1].first_byte(now)

    # -- accounting --------------------------------------------------------------------
    def _begin(self, candidate: Candidate, stream: bool) -> None:
        worker = candidate.worker
        worker.begin()
        worker.routed += 1
        worker.breaker.on_dispatch()
        self._state.metrics.in_flight.labels(worker.id).set(worker.in_flight)
        self._attempts.append(self._state.pipeline.attempt(self._routing, candidate, stream))

    def _end(self, attempt: Attempt) -> None:
        if attempt.ended:
            return
        attempt.end()
        worker = attempt.worker
        worker.finish()
        self._state.metrics.in_flight.labels(worker.id).set(worker.in_flight)

    def close(self) -> None:
        """The exchange is over (last byte, refusal, or the stream went away)."""
        if self._closed:
            return
        self._closed = True
        if self._exchange_id:
            self._observations.forget(self._exchange_id)
            if self._grace is not None:
                self._grace.cancel()
        for attempt in self._attempts:
            self._end(attempt)
        if not self._attempts:
            return
        state = self._state
        pipeline = state.pipeline
        pipeline.complete(self._attempts)
        served = self._attempts[-1].worker if self._attempts[-1].first_byte_s is not None \
            else None
        reason = self._reason if len(self._attempts) <= 1 else "failover"
        state.metrics.decisions.labels(pipeline.policy.name, reason).inc()
        state.metrics.requests.labels(self._path, served.id if served else "none",
                                      str(self._status)).inc()
        state.metrics.latency.labels(self._path).observe(time.perf_counter() - self._started)
