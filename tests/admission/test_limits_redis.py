"""Per-tenant limits: one bucket for two routers over one Redis, local shares without it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from aiohttp.test_utils import TestClient

from router.admission.limits import TenantLimits
from router.server.state import ROUTER
from tests.admission.conftest import Sim, admitting, body
from tests.unit.fakes import metric


@contextlib.asynccontextmanager
async def two_routers(sim: Sim, redis_url: str) -> AsyncIterator[tuple[TestClient, ...]]:
    # two requests of burst per tenant, refilled at one per 100 s; syncs only when told
    limits = {"redis_url": redis_url, "tenant_requests_per_s": 0.01, "tenant_burst_s": 200.0,
              "limits_sync_s": 3600.0}
    async with admitting([sim], **limits) as a, admitting([sim], **limits) as b:
        yield a, b


def limits_of(client: TestClient) -> TenantLimits:
    control = client.server.app[ROUTER].admission
    assert control is not None and control.limits is not None
    return control.limits


async def status(client: TestClient, tenant: str) -> int:
    async with client.post("/v1/completions", json=body("hello"),
                           headers={"X-Tenant": tenant}) as resp:
        await resp.read()
        if resp.status == 429:
            assert int(resp.headers["Retry-After"]) >= 1
        return resp.status


async def sync(*clients: TestClient) -> None:
    for client in clients:
        await limits_of(client).sync()


async def test_limits_are_shared_by_two_routers_and_local_while_redis_is_down(
        sims, redis_server) -> None:
    (sim,) = sims(1)
    async with two_routers(sim, redis_server.url) as (a, b):
        await sync(a, b)  # both registered: each knows there are two routers
        assert [await status(a, "t1"), await status(a, "t1")] == [200, 200]
        await sync(a, b)
        assert await status(b, "t1") == 429  # a spent the tenant's whole burst
        assert await status(b, "t2") == 200  # another tenant is not affected
        assert await metric(b, "prefix_router_admission_shed_total",
                            reason="tenant_limit") == 1

        redis_server.kill()
        await sync(a, b)
        assert await metric(a, "prefix_router_tenant_limits_shared") == 0
        # local limits: each router keeps half of the burst, so the fleet keeps its limit
        assert [await status(a, "t3"), await status(a, "t3")] == [200, 429]
        assert [await status(b, "t3"), await status(b, "t3")] == [200, 429]

        redis_server.start()
        await sync(a, b)
        assert await metric(a, "prefix_router_tenant_limits_shared") == 1
        assert await status(a, "t4") == 200
