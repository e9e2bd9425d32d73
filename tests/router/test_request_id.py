"""Every response carries ``X-Request-Id``: routed answers, streams, the router's own errors and
aiohttp's (404, 405, 413, 500); a sane incoming id is kept, an odd or oversized one replaced.

In-process aiohttp servers talking real HTTP on 127.0.0.1 (aiohttp's TestServer/TestClient).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from router.config import RouterConfig
from router.server.app import build_app
from router.server.request_id import REQUEST_ID, request_id, request_ids, stamp_request_id

MODEL = "rid-model"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}]}
GENERATED = re.compile(r"[0-9a-f]{32}")  # uuid4 hex
SEEN = web.AppKey("seen", list)


async def _ok(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def _models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})


async def _chat(request: web.Request) -> web.StreamResponse:
    request.app[SEEN].append(request.headers.get("X-Request-Id"))
    body = await request.json()
    if not body.get("stream"):
        return web.json_response({"object": "chat.completion", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}}]})
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(b'data: {"choices":[{"index":0,"delta":{"content":"ok"}}]}\n\n')
    await response.write(b"data: [DONE]\n\n")
    return response


@pytest.fixture
async def upstream() -> AsyncIterator[TestServer]:
    app = web.Application()
    app[SEEN] = []
    app.router.add_get("/health", _ok)
    app.router.add_get("/v1/models", _models)
    app.router.add_post("/v1/chat/completions", _chat)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield server
    await server.close()


@pytest.fixture
async def router(upstream: TestServer) -> AsyncIterator[TestClient]:
    url = str(upstream.make_url("")).rstrip("/")
    config = RouterConfig(workers=(("w0", url),), max_body_bytes=1024, scrape_interval_s=0)
    client = TestClient(TestServer(build_app(config), host="127.0.0.1"))
    await client.start_server()
    yield client
    await client.close()


@pytest.fixture
async def empty_router() -> AsyncIterator[TestClient]:
    client = TestClient(TestServer(build_app(RouterConfig(scrape_interval_s=0)),
                                   host="127.0.0.1"))
    await client.start_server()
    yield client
    await client.close()


@pytest.mark.parametrize(("method", "path", "body", "status"), [
    ("GET", "/no/such/route", None, 404),
    ("GET", "/v1/chat/completions", None, 405),
    ("POST", "/v1/chat/completions", b'{"pad": "' + b"a" * 4096 + b'"}', 413),
    ("POST", "/v1/chat/completions", b"{not json", 400),
    ("GET", "/health", None, 200),
    ("GET", "/metrics", None, 200),
])
async def test_every_response_has_a_generated_id(router: TestClient, method: str, path: str,
                                                 body: bytes | None, status: int) -> None:
    async with router.request(method, path, data=body) as resp:
        assert resp.status == status
        assert GENERATED.fullmatch(resp.headers["X-Request-Id"])


async def test_not_ready_has_an_id(empty_router: TestClient) -> None:
    async with empty_router.get("/ready") as resp:
        assert resp.status == 503
        assert GENERATED.fullmatch(resp.headers["X-Request-Id"])


@pytest.mark.parametrize("incoming", ["abc-123", "trace.A1:b_2-c", "x" * 128])
@pytest.mark.parametrize("path", ["/no/such/route", "/health"])
async def test_a_sane_incoming_id_is_kept(router: TestClient, incoming: str, path: str) -> None:
    async with router.get(path, headers={"X-Request-Id": incoming}) as resp:
        assert resp.headers["X-Request-Id"] == incoming


@pytest.mark.parametrize("incoming", ["x" * 129, "has space", "a/b", "semi;colon", "<id>", ""])
async def test_an_odd_or_oversized_id_is_replaced(router: TestClient, incoming: str) -> None:
    async with router.get("/no/such/route", headers={"X-Request-Id": incoming}) as resp:
        assert resp.status == 404
        assert GENERATED.fullmatch(resp.headers["X-Request-Id"])


@pytest.mark.parametrize("stream", [False, True])
async def test_routed_answers_carry_the_id_the_upstream_saw(
        router: TestClient, upstream: TestServer, stream: bool) -> None:
    async with router.post("/v1/chat/completions", json={**CHAT, "stream": stream},
                           headers={"X-Request-Id": "req-7"}) as resp:
        assert resp.status == 200, await resp.text()
        await resp.read()
        assert resp.headers["X-Request-Id"] == "req-7"
    assert upstream.app[SEEN] == ["req-7"]


@pytest.mark.parametrize("stream", [False, True])
async def test_routed_answers_replace_an_odd_id(router: TestClient, stream: bool) -> None:
    async with router.post("/v1/chat/completions", json={**CHAT, "stream": stream},
                           headers={"X-Request-Id": "x" * 500}) as resp:
        assert resp.status == 200, await resp.text()
        await resp.read()
        assert GENERATED.fullmatch(resp.headers["X-Request-Id"])


async def _echo(request: web.Request) -> web.Response:
    return web.json_response({"key": request[REQUEST_ID], "helper": request_id(request)})


async def _crash(request: web.Request) -> web.Response:
    raise RuntimeError("handler bug")


@pytest.fixture
async def bare() -> AsyncIterator[TestClient]:
    """Only the middleware and the hook, to pin down what handlers can rely on."""
    app = web.Application(middlewares=[request_ids])
    app.on_response_prepare.append(stamp_request_id)
    app.router.add_get("/echo", _echo)
    app.router.add_get("/crash", _crash)
    client = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    yield client
    await client.close()


async def test_handlers_read_the_chosen_id(bare: TestClient) -> None:
    async with bare.get("/echo", headers={"X-Request-Id": "from-client"}) as resp:
        assert await resp.json() == {"key": "from-client", "helper": "from-client"}
        assert resp.headers["X-Request-Id"] == "from-client"
    async with bare.get("/echo", headers={"X-Request-Id": "bad id"}) as resp:
        got = await resp.json()
        assert got["key"] == got["helper"] == resp.headers["X-Request-Id"]
        assert GENERATED.fullmatch(got["key"])


async def test_aiohttp_own_500_has_the_id(bare: TestClient) -> None:
    async with bare.get("/crash", headers={"X-Request-Id": "crash-1"}) as resp:
        assert resp.status == 500
        assert resp.headers["X-Request-Id"] == "crash-1"
