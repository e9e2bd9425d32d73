"""The proxy's failover order: the ranked workers in turn, at most --retry-attempts of them.

Round-robin ranks the first request [w0, w1, w2] (the pool's order). w0 answers 503; w1
passed its health check at start and then went away, so its port refuses connections (the
health loop is stopped, so the router does not notice before the request); w2 answers.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient

from router.infra.supervisor import SUPERVISOR
from router.server.state import ROUTER
from tests.unit.fakes import FakeWorker, chat_body, fake_workers, metric, router_client

HOUR = 3600.0
RETRIES = "prefix_router_retries_total"


@contextlib.asynccontextmanager
async def ranked_fleet(*, close_w1: bool = True, **overrides: Any
                       ) -> AsyncIterator[tuple[TestClient, list[FakeWorker]]]:
    async with fake_workers(3) as fakes:
        fakes[0].status = 503
        settings = {"policy": "round_robin", "health_interval_s": HOUR,
                    "scrape_interval_s": 0.0, "retry_backoff_s": 0.0, **overrides}
        async with router_client(fakes, **settings) as client:
            # no health check from now on: the router keeps believing what it saw at start
            await client.server.app[SUPERVISOR].stop("health")
            assert all(w.healthy for w in client.server.app[ROUTER].pool)
            if close_w1:
                await fakes[1].close()
            yield client, fakes


def error_of(body: bytes) -> dict[str, Any]:
    error = orjson.loads(body)["error"]
    assert {"message", "type", "code"} <= error.keys()
    return error


@pytest.mark.parametrize("stream", [False, True])
async def test_a_503_then_a_refused_connection_are_skipped_for_the_third(stream: bool) -> None:
    async with ranked_fleet(retry_attempts=3) as (client, (w0, w1, w2)):
        async with client.post("/v1/chat/completions",
                               json=chat_body("hello", stream=stream)) as resp:
            assert resp.status == 200
            assert resp.headers["X-Prefix-Router-Worker"] == "w2"
            assert resp.headers["X-Prefix-Router-Reason"] == "failover"
            assert resp.headers["X-Request-Id"]
            body = await resp.read()
        assert body == w2.sent[0]
        assert w0.log == ["w0", "w2"]  # shared log: w0 first, then (w1 refused) w2
        assert not w1.received
        assert await metric(client, RETRIES, cause="upstream_5xx") == 1
        assert await metric(client, RETRIES, cause="upstream_unreachable") == 1
        assert await metric(client, "prefix_router_requests_total", worker="w2",
                            status="200") == 1
        assert await metric(client, "prefix_router_routing_decisions_total",
                            policy="round_robin", reason="failover") == 1


@pytest.mark.parametrize("attempts, status, code, tried", [
    (1, 502, "upstream_5xx", ["w0"]),
    (2, 502, "upstream_unreachable", ["w0"]),  # w1 was tried too, and refused
])
async def test_at_most_retry_attempts_workers_are_tried(attempts: int, status: int, code: str,
                                                        tried: list[str]) -> None:
    async with ranked_fleet(retry_attempts=attempts) as (client, (w0, _w1, w2)):
        async with client.post("/v1/chat/completions", json=chat_body("hello")) as resp:
            assert resp.status == status
            assert resp.headers["X-Request-Id"]
            assert "X-Prefix-Router-Worker" not in resp.headers
            error = error_of(await resp.read())
        assert (error["code"], error["type"]) == (code, "upstream_error")
        assert w0.log == tried and not w2.received
        assert await metric(client, RETRIES, cause="upstream_5xx") == (attempts > 1)
        assert await metric(client, RETRIES, cause="upstream_unreachable") == 0
        assert await metric(client, "prefix_router_requests_total", worker="none",
                            status=str(status)) == 1


async def test_every_try_a_5xx_is_a_502() -> None:
    async with ranked_fleet(close_w1=False, retry_attempts=3) as (client, fakes):
        for fake in fakes:
            fake.status = 500
        async with client.post("/v1/completions", json={"prompt": "hi"}) as resp:
            assert resp.status == 502
            error = error_of(await resp.read())
        assert error["code"] == "upstream_5xx"
        assert fakes[0].log == ["w0", "w1", "w2"]
        assert await metric(client, RETRIES, cause="upstream_5xx") == 2


async def test_no_routable_worker_is_a_503_with_retry_after() -> None:
    async with ranked_fleet(close_w1=False) as (client, fakes):
        for worker in client.server.app[ROUTER].pool:
            worker.healthy = False
        async with client.post("/v1/completions", json={"prompt": "hi"}) as resp:
            assert resp.status == 503
            assert int(resp.headers["Retry-After"]) >= 1
            error = error_of(await resp.read())
        assert (error["code"], error["type"]) == ("no_worker_available", "service_unavailable")
        assert not fakes[0].log


async def test_a_workers_4xx_passes_through_and_is_not_retried() -> None:
    async with ranked_fleet(close_w1=False) as (client, (w0, w1, w2)):
        w0.status = 422
        async with client.post("/v1/chat/completions", json=chat_body("hello")) as resp:
            assert resp.status == 422
            assert resp.headers["X-Prefix-Router-Worker"] == "w0"
            assert await resp.read() == w0.sent[0]
        assert w0.log == ["w0"] and not w1.received and not w2.received
        assert await metric(client, RETRIES, cause="upstream_5xx") == 0


async def test_a_worker_silent_past_the_first_byte_timeout_is_skipped() -> None:
    async with ranked_fleet(close_w1=False, first_byte_timeout_s=0.2) as (client, fakes):
        fakes[0].status, fakes[0].hang = 200, True
        async with client.post("/v1/chat/completions", json=chat_body("hello")) as resp:
            assert resp.status == 200
            assert resp.headers["X-Prefix-Router-Worker"] == "w1"
        assert fakes[0].log == ["w0", "w1"]
        assert await metric(client, RETRIES, cause="upstream_timeout") == 1


async def test_the_failover_order_is_the_ranked_order() -> None:
    """Round-robin's second request starts at w1: its failover goes w1 -> w2 -> w0."""
    async with ranked_fleet(close_w1=False) as (client, fakes):
        async with client.post("/v1/completions", json={"prompt": "first"}) as resp:
            assert resp.headers["X-Prefix-Router-Worker"] == "w1"  # w0 503 -> w1
        fakes[0].status, fakes[1].status, fakes[2].status = 200, 503, 503
        async with client.post("/v1/completions", json={"prompt": "second"}) as resp:
            assert resp.status == 200
            assert resp.headers["X-Prefix-Router-Worker"] == "w0"
        assert fakes[0].log == ["w0", "w1", "w1", "w2", "w0"]
