"""/openapi.json is the router's surface, no more and no less (issue 16, item 7)."""

from __future__ import annotations

from aiohttp.test_utils import TestClient, TestServer

from router.config import RouterConfig
from router.server.app import build_app


def app_routes(app) -> set[tuple[str, str]]:
    return {(r.method, r.resource.canonical) for r in app.router.routes()
            if r.method != "HEAD" and r.resource is not None}


async def test_the_document_lists_exactly_the_apps_routes() -> None:
    app = build_app(RouterConfig(admin_token="t"))
    client = TestClient(TestServer(app))
    await client.start_server()
    try:
        resp = await client.get("/openapi.json")
        assert resp.status == 200
        doc = await resp.json()
    finally:
        await client.close()
    documented = {(method.upper(), path) for path, ops in doc["paths"].items() for method in ops}
    assert documented == app_routes(app)
    assert doc["openapi"].startswith("3.1")
    ids = [op["operationId"] for ops in doc["paths"].values() for op in ops.values()]
    assert len(ids) == len(set(ids))
    for path, ops in doc["paths"].items():
        for op in ops.values():
            names = {p["name"] for p in op.get("parameters", [])}
            assert names == {part[1:-1] for part in path.split("/") if part.startswith("{")}
            for answer in op["responses"].values():
                ref = answer.get("$ref")
                assert ref is None or ref.rsplit("/", 1)[-1] in doc["components"]["responses"]
    chat = doc["paths"]["/v1/chat/completions"]["post"]
    assert "message's role and content" in chat["x-prefix-router-keyed-on"]
    pinned = doc["paths"]["/v1/responses/{response_id}"]["get"]
    assert "made the response" in pinned["x-prefix-router-failover"]
    assert doc["paths"]["/admin/workers"]["get"]["security"] == [{"adminToken": []}]
