"""Response bodies read off the data path: the picker's side of Envoy's observer filter.

In the shipped Envoy config (deploy/envoy/envoy.yaml) the picking filter sends request
headers, the buffered body and the response headers, and waits for each answer; the
response body goes to a second ext_proc filter in ``observability_mode``, whose messages
Envoy sends without waiting for (or reading) any reply, so a picker that falls behind
delays what it learns, never a response chunk. The pick names its exchange in dynamic
metadata (router/epp/protocol.py); the observer filter forwards that namespace with each
chunk, which is how a chunk finds its exchange here. The picking filter's gRPC stream
carries ``OBSERVER_METADATA`` so the exchange knows to wait for an observation, not to
take the response headers as its first byte.
"""

from __future__ import annotations

import itertools
import secrets
from typing import Protocol

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc

from router.epp import protocol
from router.infra.metrics import RouterMetrics

OBSERVER_METADATA = "x-prefix-router-observer"  # value "response-body" on the picking stream


class Observed(Protocol):
    """What an observation feeds: an exchange still waiting for its answer's body."""

    def observe(self, body: ext_proc.HttpBody) -> None: ...

    def observation_over(self) -> None: ...


class Observations:
    """Exchanges waiting for their observed response body, by the id their pick carried."""

    def __init__(self, metrics: RouterMetrics) -> None:
        self._metrics = metrics
        self._prefix = secrets.token_hex(4)  # ids from another picker process never match
        self._ids = itertools.count(1)
        self._open: dict[str, Observed] = {}

    def open(self, exchange: Observed) -> str:
        exchange_id = f"{self._prefix}-{next(self._ids)}"
        self._open[exchange_id] = exchange
        return exchange_id

    def forget(self, exchange_id: str) -> None:
        self._open.pop(exchange_id, None)

    def __len__(self) -> int:
        return len(self._open)

    async def follow(self, message: ext_proc.ProcessingRequest,
                     context: grpc.aio.ServicerContext) -> None:
        """One observer stream (one response), from its first message: each body chunk to
        the exchange its metadata names, no reply written (Envoy ignores them). Returning
        early ends the RPC, so Envoy stops sending a response nobody follows."""
        target: Observed | None = None
        try:
            while message is not grpc.aio.EOF:
                if message.HasField("response_body"):
                    if target is None:
                        exchange_id = protocol.exchange_id(message)
                        if not exchange_id:
                            return  # a response the picker did not place (refusal, fail open)
                        target = self._open.get(exchange_id)
                        if target is None:  # already ended (too late), or another replica's
                            self._metrics.epp_observations.labels("unmatched").inc()
                            return
                    target.observe(message.response_body)
                    if message.response_body.end_of_stream:
                        return
                message = await context.read()
        finally:
            if target is not None:
                target.observation_over()
