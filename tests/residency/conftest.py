"""Fixtures of the Redis acceptance tests (the private redis-server comes from tests/conftest)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.redis.fleet import Fleet


@pytest.fixture
def fleet() -> Iterator[Fleet]:
    f = Fleet()
    yield f
    f.close()
