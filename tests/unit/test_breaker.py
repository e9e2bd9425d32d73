"""The per-worker circuit breaker (router/fleet/breaker.py): closed -> open -> half-open -> ...

The breaker reads time.monotonic() itself, so the cooldown is steered through its public
``cooldown_s``: 0 makes an open breaker due for its probe at once, an hour keeps it open.
One test waits out a real, tiny cooldown by polling (never asserting how long it took).
"""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.fleet.breaker import BreakerState, CircuitBreaker
from router.fleet.workers import Worker, WorkerPool

RELAXED = settings(deadline=None)  # a busy machine must not fail an example on time
HOUR = 3600.0


def opened(threshold: int = 3, cooldown_s: float = HOUR) -> CircuitBreaker:
    breaker = CircuitBreaker(threshold=threshold, cooldown_s=cooldown_s)
    for _ in range(threshold):
        breaker.on_failure()
    return breaker


def test_a_new_breaker_is_closed_and_allows() -> None:
    breaker = CircuitBreaker()
    assert breaker.state is BreakerState.CLOSED and breaker.allows()
    breaker.on_dispatch()  # dispatches while closed never block the next
    assert breaker.allows()


@pytest.mark.parametrize("threshold", [1, 2, 3, 5])
def test_it_opens_after_threshold_consecutive_failures(threshold: int) -> None:
    breaker = CircuitBreaker(threshold=threshold, cooldown_s=HOUR)
    for _ in range(threshold - 1):
        breaker.on_failure()
        assert breaker.state is BreakerState.CLOSED and breaker.allows()
    breaker.on_failure()
    assert breaker.state is BreakerState.OPEN and not breaker.allows()


@RELAXED
@given(st.lists(st.booleans(), max_size=40), st.integers(1, 5))
def test_only_consecutive_failures_count(outcomes: list[bool], threshold: int) -> None:
    """Open exactly when some run of ``threshold`` failures had no success after it."""
    breaker = CircuitBreaker(threshold=threshold, cooldown_s=HOUR)
    run, should_be_open = 0, False
    for ok in outcomes:
        if ok:
            breaker.on_success()
            run, should_be_open = 0, False
        else:
            breaker.on_failure()
            run += 1
            should_be_open = should_be_open or run >= threshold
    assert (breaker.state is BreakerState.OPEN) == should_be_open
    assert breaker.allows() == (not should_be_open)


def test_after_the_cooldown_one_probe_goes_through() -> None:
    breaker = opened()
    breaker.cooldown_s = 0.0
    assert breaker.state is BreakerState.HALF_OPEN and breaker.allows()
    breaker.on_dispatch()  # the probe is out: nobody else until it answers
    assert breaker.state is BreakerState.HALF_OPEN and not breaker.allows()


def test_a_successful_probe_closes_it() -> None:
    breaker = opened()
    breaker.cooldown_s = 0.0
    breaker.on_dispatch()
    breaker.on_success()
    breaker.cooldown_s = HOUR
    assert breaker.state is BreakerState.CLOSED and breaker.allows()
    # and the failure count started over: threshold - 1 failures keep it closed
    breaker.on_failure()
    breaker.on_failure()
    assert breaker.state is BreakerState.CLOSED


def test_a_failed_probe_reopens_it_at_once() -> None:
    breaker = opened()
    breaker.cooldown_s = 0.0
    breaker.on_dispatch()
    breaker.on_failure()  # one failure is enough in half-open, not threshold
    breaker.cooldown_s = HOUR  # the new cooldown runs from the probe's failure
    assert breaker.state is BreakerState.OPEN and not breaker.allows()
    breaker.cooldown_s = 0.0
    assert breaker.state is BreakerState.HALF_OPEN and breaker.allows()  # a fresh probe


def test_a_real_cooldown_elapses_into_half_open() -> None:
    breaker = opened(threshold=2, cooldown_s=0.02)
    deadline = time.monotonic() + 10
    while breaker.state is not BreakerState.HALF_OPEN:
        assert time.monotonic() < deadline, "the cooldown never elapsed"
        time.sleep(0.005)
    assert breaker.allows()
    breaker.on_dispatch()
    breaker.on_success()
    assert breaker.state is BreakerState.CLOSED


def test_an_open_breaker_takes_the_worker_out_of_the_candidates() -> None:
    pool = WorkerPool()
    a = pool.add(Worker("a", "http://a", healthy=True,
                        breaker=CircuitBreaker(threshold=1, cooldown_s=HOUR)))
    b = pool.add(Worker("b", "http://b", healthy=True))
    assert pool.candidates(None) == [a, b]
    a.breaker.on_failure()
    assert pool.candidates(None) == [b]
    a.breaker.cooldown_s = 0.0  # half-open: back in for its one probe
    assert pool.candidates(None) == [a, b]
    a.breaker.on_dispatch()
    assert pool.candidates(None) == [b]
    a.breaker.on_success()
    assert pool.candidates(None) == [a, b]


def test_an_abandoned_probe_frees_the_probe_slot() -> None:
    """A probe whose client went away has no verdict: the next request may probe."""
    breaker = opened()
    breaker.cooldown_s = 0.0
    breaker.on_dispatch()
    assert not breaker.allows()  # the one probe is out
    breaker.on_abandoned()
    assert breaker.allows() and breaker.state is BreakerState.HALF_OPEN
