"""Fixtures of the engine tests: one pair of real vLLM workers for all of them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.engine.vllm_fleet import Fleet, Worker, run_fleet, run_reranker


@pytest.fixture(scope="package")
def vllm_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Started by the first test that needs it, stopped after the last test of this package
    (not held through the rest of the session: each worker takes ~2.7 GiB)."""
    yield from run_fleet(tmp_path_factory.mktemp("real-vllm"))


@pytest.fixture(autouse=True)
def vllm_fleet_alive(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test on the fleet: a worker that died during it fails the test with the
    end of its log (the reason is otherwise lost with the tmp dir), and is started again so
    the tests after it run on a whole fleet."""
    yield
    if ("vllm_fleet" not in request.fixturenames
            or request.node.get_closest_marker("stops_worker") is not None):
        return
    fleet: Fleet = request.getfixturevalue("vllm_fleet")
    dead = fleet.dead()
    reports = [f"worker {w.name} (port {w.port}) exited with {w.proc.returncode} during this "
               f"test; the end of its log:\n{w.tail()}" for w in dead]
    for worker in dead:
        fleet.revive(worker)
    if reports:
        pytest.fail("\n\n".join(reports), pytrace=False)


@pytest.fixture(scope="module")
def vllm_reranker(vllm_fleet: Fleet) -> Iterator[Worker]:
    """A pooling worker serving the fleet's tiny reranker; only the API tests need it, so it
    stops with their module (one more vLLM start, ~1 min on 2 cores)."""
    yield from run_reranker(vllm_fleet)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "stops_worker: stops a shared vLLM worker (runs last)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that stop a shared worker (``@pytest.mark.stops_worker``) run after the other
    engine tests; everything else keeps its place."""
    slots = [k for k, item in enumerate(items) if item.nodeid.startswith("tests/engine/")]
    ordered = sorted((items[k] for k in slots),
                     key=lambda item: item.get_closest_marker("stops_worker") is not None)
    for k, item in zip(slots, ordered, strict=True):
        items[k] = item
