"""Backoff arithmetic and Retry-After parsing (the HTTP behaviour is in test_client_http)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

from router.client.retry import Backoff, parse_retry_after


def test_exponential_with_equal_jitter() -> None:
    backoff = Backoff(initial=1.0, maximum=8.0, multiplier=2.0)
    rng = random.Random(7)
    for attempt, ceiling in [(0, 1.0), (1, 2.0), (2, 4.0), (3, 8.0), (6, 8.0)]:
        delays = [backoff.delay(attempt, None, rng) for _ in range(200)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(set(delays)) > 100  # jittered, not constant


def test_retry_after_is_a_floor() -> None:
    rng = random.Random(1)
    backoff = Backoff()
    assert backoff.delay(0, 0.0, rng) == 0.0
    for _ in range(100):
        assert 3.0 <= backoff.delay(5, 3.0, rng) <= 3.3


def test_parse_retry_after() -> None:
    assert parse_retry_after(None) is None
    assert parse_retry_after("0") == 0.0
    assert parse_retry_after(" 2 ") == 2.0
    assert parse_retry_after("1.5") == 1.5
    assert parse_retry_after("-3") == 0.0
    assert parse_retry_after("soon") is None
    now = datetime(2025, 1, 1, tzinfo=UTC)
    date = format_datetime(now + timedelta(seconds=30), usegmt=True)
    assert parse_retry_after(date, now=now) == 30.0
