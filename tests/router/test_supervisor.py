"""Background work cannot die silently: a worker's garbage never freezes health or scrapes,
and a task that raises is logged, counted and restarted.

Workers and router talk real HTTP on 127.0.0.1 (in-process aiohttp servers).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families

from router.config import RouterConfig
from router.infra.metrics import RouterMetrics
from router.infra.supervisor import SUPERVISOR, Supervisor
from router.server.app import build_app
from tests.support import free_port

MODEL = "sup-model"
GOOD_MODELS = b'{"object": "list", "data": [{"id": "sup-model", "object": "model"}]}'
GOOD_METRICS = b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n"


@dataclass
class FakeWorker:
    """An engine on 127.0.0.1 that answers /health 200 and fixed /v1/models and /metrics."""

    models_body: bytes
    metrics_body: bytes
    port: int = field(default_factory=free_port)
    hits: Counter[str] = field(default_factory=Counter)
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _answer(self, body: bytes, content_type: str) -> Callable[[web.Request],
                                                                  Awaitable[web.Response]]:
        async def handler(request: web.Request) -> web.Response:
            self.hits[request.path] += 1
            return web.Response(body=body, content_type=content_type)
        return handler

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/health", self._answer(b"ok", "text/plain"))
        app.router.add_get("/v1/models", self._answer(self.models_body, "application/json"))
        app.router.add_get("/metrics", self._answer(self.metrics_body, "text/plain"))
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


async def eventually(check: Callable[[], bool | Awaitable[bool]],
                     within_s: float = 20.0) -> None:
    """Poll until ``check`` holds; the deadline is a hang guard, not a timing claim."""
    deadline = time.monotonic() + within_s
    while not await _value(check()):
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def _value(result: bool | Awaitable[bool]) -> bool:
    return await result if inspect.isawaitable(result) else result


def samples(text: str, name: str) -> dict[str, float]:
    """The samples named ``name`` (``..._total`` for a counter), keyed by their one label."""
    return {next(iter(s.labels.values()), ""): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == name}


@dataclass
class Router:
    server: TestServer
    http: aiohttp.ClientSession

    async def metrics(self, name: str) -> dict[str, float]:
        async with self.http.get(str(self.server.make_url("/metrics"))) as resp:
            return samples(await resp.text(), name)

    async def healthy(self, worker: str) -> float | None:
        return (await self.metrics("prefix_router_worker_healthy")).get(worker)


@pytest.fixture
async def fleet_with_garbage(request: pytest.FixtureRequest
                             ) -> AsyncIterator[tuple[Router, FakeWorker, FakeWorker]]:
    models_body, metrics_body = request.param
    bad = FakeWorker(models_body, metrics_body)
    good = FakeWorker(GOOD_MODELS, GOOD_METRICS)
    await bad.start()
    await good.start()
    config = RouterConfig(workers=(("bad", bad.url), ("good", good.url)),
                          health_interval_s=0.05, health_timeout_s=0.5, scrape_interval_s=0.05)
    server = TestServer(build_app(config), host="127.0.0.1")
    await server.start_server()
    http = aiohttp.ClientSession()
    try:
        yield Router(server, http), bad, good
    finally:
        await http.close()
        await server.close()
        await good.stop()
        await bad.stop()


GARBAGE = [
    (b"[1, 2]", b"\xff\xfe\x00 not text"),
    (b'{"data": 5}', b"vllm:num_requests_running NaN\n"),
    (b"<html>not json</html>", b"vllm:num_requests_waiting +Inf\nvllm:num_requests_running x\n"),
    (b'{"data": [1, {"id": null}, "x"]}',
     b'vllm:cache_config_info{num_gpu_blocks="many",block_size="16"} 1.0\n{{{\n'),
]


@pytest.mark.parametrize("fleet_with_garbage", GARBAGE, indirect=True,
                         ids=["list", "data-int", "html", "odd-entries"])
async def test_garbage_from_one_worker_never_freezes_health_or_scrapes(
        fleet_with_garbage: tuple[Router, FakeWorker, FakeWorker]) -> None:
    router, bad, good = fleet_with_garbage
    await eventually(lambda: _is(router.healthy("good"), 1.0))
    await eventually(lambda: bad.hits["/v1/models"] >= 3 and bad.hits["/metrics"] >= 3)
    scrapes = good.hits["/metrics"]
    await eventually(lambda: good.hits["/metrics"] >= scrapes + 3)  # the scraper lives on

    await good.stop()  # health keeps updating: the good worker goes down...
    await eventually(lambda: _is(router.healthy("good"), 0.0))
    await good.start()  # ...and comes back
    await eventually(lambda: _is(router.healthy("good"), 1.0))

    assert await router.healthy("bad") == 1.0  # its /health says yes; garbage costs it models
    assert await router.healthy("good") == 1.0
    async with router.http.get(str(router.server.make_url("/v1/models"))) as resp:
        listed = [m["id"] for m in (await resp.json())["data"]]
    assert listed == [MODEL]
    errors = await router.metrics("prefix_router_background_errors_total")
    assert not errors.get("health") and not errors.get("scraper")  # handled per worker


@pytest.mark.parametrize("fleet_with_garbage", GARBAGE[:1], indirect=True, ids=["list"])
async def test_a_raising_task_is_counted_and_restarted_in_the_app(
        fleet_with_garbage: tuple[Router, FakeWorker, FakeWorker]) -> None:
    router, _, good = fleet_with_garbage
    runs = 0

    async def broken() -> None:
        nonlocal runs
        runs += 1
        raise RuntimeError("background bug")

    router.server.app[SUPERVISOR].start("probe", broken)
    await eventually(lambda: _counted(router, "probe", 2))  # restarted after its first failure
    assert runs >= 2
    await good.stop()  # the app's own loops are unaffected
    await eventually(lambda: _is(router.healthy("good"), 0.0))


async def _is(value: Awaitable[float | None], expected: float) -> bool:
    return await value == expected


async def _counted(router: Router, task: str, at_least: float) -> bool:
    errors = await router.metrics("prefix_router_background_errors_total")
    return errors.get(task, 0.0) >= at_least


async def test_supervisor_logs_counts_and_restarts_a_task_that_raises(
        caplog: pytest.LogCaptureFixture) -> None:
    metrics = RouterMetrics()
    supervisor = Supervisor(metrics.background_errors, initial_backoff_s=0.001,
                            max_backoff_s=0.01)
    runs = 0
    healthy = asyncio.Event()

    async def flaky() -> None:
        nonlocal runs
        runs += 1
        if runs <= 2:
            raise ValueError(f"failure {runs}")
        healthy.set()
        await asyncio.Event().wait()  # the third run stays up

    with caplog.at_level(logging.ERROR, logger="router.infra.supervisor"):
        supervisor.start("flaky", flaky, label="flaky-kind")
        await asyncio.wait_for(healthy.wait(), 20)
    assert runs == 3
    errors = samples(metrics.render().decode(), "prefix_router_background_errors_total")
    assert errors == {"flaky-kind": 2.0}
    failures = [r for r in caplog.records if r.name == "router.infra.supervisor"]
    assert len(failures) == 2 and all(r.exc_info for r in failures)  # with tracebacks
    assert "failure 1" in caplog.text and "Traceback" in caplog.text
    with pytest.raises(ValueError, match="already running"):
        supervisor.start("flaky", flaky)
    await supervisor.close()
    assert supervisor.names() == []


async def test_supervisor_does_not_restart_a_task_that_returns_or_is_stopped() -> None:
    supervisor = Supervisor(initial_backoff_s=0.001)
    runs: Counter[str] = Counter()
    started = asyncio.Event()

    async def once() -> None:
        runs["once"] += 1

    async def forever() -> None:
        runs["forever"] += 1
        started.set()
        await asyncio.Event().wait()

    supervisor.start("once", once)
    supervisor.start("forever", forever)
    await asyncio.wait_for(started.wait(), 20)
    await eventually(lambda: "once" not in supervisor.names())  # done, not restarted
    await supervisor.stop("forever")
    assert supervisor.names() == []
    await asyncio.sleep(0.05)
    assert runs == {"once": 1, "forever": 1}
    await supervisor.stop("never-started")  # a no-op
