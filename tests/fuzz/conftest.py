"""The live fleet and the driver the fuzz tests share (started once per module)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.fuzz.cases import Route, routes_from
from tests.fuzz.driver import Driver
from tests.fuzz.fleet import FuzzFleet, start_fleet


@dataclass
class Fuzz:
    fleet: FuzzFleet
    driver: Driver
    routes: list[Route]


@pytest.fixture(scope="module")
def fuzz() -> Iterator[Fuzz]:
    fleet = start_fleet()
    driver = None
    try:
        with urllib.request.urlopen(fleet.routers[0].url + "/openapi.json", timeout=10) as resp:
            routes = routes_from(json.load(resp))
        driver = Driver([r.port for r in fleet.routers])
        yield Fuzz(fleet, driver, routes)
    finally:
        if driver is not None:
            driver.close()
        fleet.stop()
