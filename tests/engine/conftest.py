"""Session fixtures of the engine tests: one pair of real vLLM workers for all of them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.engine.vllm_fleet import Fleet, run_fleet


@pytest.fixture(scope="session")
def vllm_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    yield from run_fleet(tmp_path_factory.mktemp("real-vllm"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that stop a shared worker (``@pytest.mark.stops_worker``) run last."""
    items.sort(key=lambda item: item.get_closest_marker("stops_worker") is not None)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "stops_worker: stops a shared vLLM worker (runs last)")
