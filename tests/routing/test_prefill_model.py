"""The learned prefill line: it finds a worker's speed, and stays with its fleet's."""

from __future__ import annotations

from router.fleet.prefill_model import PrefillModel


def answers(model: PrefillModel, rate: float, base: float, n: int = 60) -> None:
    for i in range(n):
        tokens = 500 + (i * 977) % 12_000
        model.observe(tokens, base + tokens / rate)


def test_the_line_finds_the_worker_speed_from_its_answers() -> None:
    model = PrefillModel(seed_rate=20_000, seed_base_s=0.02)
    answers(model, rate=40_000, base=0.03)
    assert 36_000 < model.rate < 44_000 and abs(model.base_s - 0.03) < 0.02  # prior pulls
    assert model.seconds(8000) > model.seconds(1000)


def test_answers_of_one_size_do_not_throw_the_slope() -> None:
    model = PrefillModel(seed_rate=20_000, seed_base_s=0.02)
    for _ in range(50):
        model.observe(3000, 0.17)  # no spread in tokens: the prior keeps a slope
    assert 5_000 < model.rate < 80_000
    assert abs(model.seconds(3000) - 0.17) < 0.03


def test_a_worker_without_answers_follows_its_fleet_and_one_that_goes_quiet_returns() -> None:
    fleet = PrefillModel(seed_rate=20_000, seed_base_s=0.02)
    busy, quiet = fleet.child(), fleet.child()
    answers(busy, rate=10_000, base=0.02)  # every answer teaches the fleet too
    assert fleet.rate < 15_000
    quiet.refresh()
    assert quiet.rate == fleet.rate  # no answers of its own: the fleet's line
    # one slow worker's own line departs from the fleet only as far as its answers weigh
    slow = fleet.child()
    slow.observe(4000, 4000 / 2_000 + 0.02)
    assert fleet.rate * 0.3 < slow.rate < fleet.rate
    slow.observed_at -= 60  # silent for a minute: its own answers are forgotten
    slow.refresh()
    assert slow.rate == fleet.rate and slow.samples == 0
