"""Admin API: token-protected listing, add, drain and remove of workers."""

from __future__ import annotations

import aiohttp

from tests.router.conftest import MODEL, start_router, start_upstreams
from tests.support import stop

TOKEN = "s3cret"


async def test_admin_lists_adds_drains_and_removes_workers() -> None:
    ups = start_upstreams(2)
    port, router = start_router([ups[0].url], env={"PREFIX_ROUTER_ADMIN_TOKEN": TOKEN})
    base = f"http://127.0.0.1:{port}"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(base + "/admin/workers") as r:
                assert r.status == 401
            async with s.get(base + "/admin/workers",
                             headers={"Authorization": "Bearer wrong"}) as r:
                assert r.status == 401
            async with s.post(base + "/admin/workers", headers=auth,
                              json={"id": "extra", "url": ups[1].url}) as r:
                assert r.status == 201
                added = await r.json()
                assert added["healthy"] is True and added["models"] == [MODEL]
            async with s.get(base + "/admin/workers", headers=auth) as r:
                listing = {w["id"]: w for w in (await r.json())["workers"]}
            assert set(listing) == {"w0", "extra"}
            assert set(listing["w0"]) >= {"id", "url", "models", "healthy", "breaker",
                                          "in_flight", "routed"}
            async with s.post(base + "/admin/workers/w0/drain", headers=auth) as r:
                assert (await r.json())["draining"] is True
            for _ in range(10):
                async with s.post(base + "/v1/chat/completions", json=chat) as r:
                    assert r.headers["X-Prefix-Router-Worker"] == "extra"
            async with s.delete(base + "/admin/workers/extra", headers=auth) as r:
                assert r.status == 204
            async with s.post(base + "/v1/chat/completions", json=chat) as r:
                assert r.status == 503  # the only other worker is draining
            async with s.delete(base + "/admin/workers/extra", headers=auth) as r:
                assert r.status == 404
    finally:
        for p in [router, *(u.proc for u in ups)]:
            stop(p)
