"""Retry timing: jittered exponential backoff that honours Retry-After.

Why jitter: a router that sheds load answers many clients with 503 at the same instant;
clients that all retry after exactly 0.5, 1, 2 s come back as the same thundering herd.
Why honour Retry-After: the router knows when capacity frees up; guessing shorter only adds
load, and a server asking for more than `max_retry_after` is better reported than waited on.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

RETRY_STATUSES = frozenset({429, 503})
"""Statuses retried by the SDK. 502/504 are not: the router already failed over across
workers before answering them."""


@dataclass(frozen=True)
class Backoff:
    """Delays between attempts: `initial * multiplier**n` capped at `maximum`, with "equal
    jitter" (half fixed, half random) so delays keep growing yet never align."""

    initial: float = 0.5
    maximum: float = 8.0
    multiplier: float = 2.0
    max_retry_after: float = 60.0

    def delay(self, attempt: int, retry_after: float | None, rng: random.Random) -> float:
        """Seconds to wait before retry number `attempt + 1` (attempt counts from 0)."""
        if retry_after is not None:
            # Never earlier than asked; spread up to 10 % later to break up the herd.
            return retry_after + rng.uniform(0.0, 0.1 * retry_after)
        ceiling = min(self.maximum, self.initial * self.multiplier**attempt)
        return ceiling / 2 + rng.uniform(0.0, ceiling / 2)


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date); None if absent or
    unparseable."""
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())
