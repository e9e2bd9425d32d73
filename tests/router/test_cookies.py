"""A worker's Set-Cookie goes to its client and is never replayed on another client's request."""

from __future__ import annotations

import aiohttp

from tests.router.conftest import start_router, start_upstreams
from tests.support import stop

CHAT = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}]}


async def test_worker_cookies_are_not_shared_between_clients() -> None:
    (up,) = start_upstreams(1)
    # by host name: a cookie jar keeps cookies of named hosts (it drops those of IPs)
    port, router = start_router([f"http://localhost:{up.port}"])
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    try:
        async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as client:
            async with client.post(url, json=CHAT, headers={"X-Test-Mode": "set-cookie"}) as resp:
                assert resp.status == 200
                assert "session=of-w0" in resp.headers["Set-Cookie"]  # the client gets it
            async with client.post(url, json=CHAT) as resp:  # as another client would
                assert resp.status == 200
            assert "cookie" not in {k.lower() for k in up.stats()["headers"]}
    finally:
        stop(router)
        stop(up.proc)
