"""The overload bench's fairness yardstick: max-min fair shares by water filling."""

from __future__ import annotations

import pytest

from bench.overload import fair_shares


def test_a_tenant_asking_less_than_an_equal_share_is_owed_all_it_asked() -> None:
    shares = fair_shares({"heavy": 10_000.0, "a": 1_000.0, "b": 1_000.0}, 6_000.0)
    assert shares == {"a": 1_000.0, "b": 1_000.0, "heavy": 4_000.0}


def test_equal_demands_past_capacity_split_it_equally() -> None:
    shares = fair_shares({"x": 9.0, "y": 9.0, "z": 9.0}, 6.0)
    assert shares == pytest.approx({"x": 2.0, "y": 2.0, "z": 2.0})
