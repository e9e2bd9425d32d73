"""Every error class in OpenAI's shape with its status; /metrics, /ready, /v1/models, admin."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.router.conftest import MODEL, Fleet
from tests.support import spawn

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}]}
ERROR_ARGS = ("--max-body-bytes", "4096", "--first-byte-timeout-s", "0.5",
              "--retry-attempts", "2")


async def _post(fleet: Fleet, body: object = None, raw: bytes | None = None,
                headers: dict[str, str] | None = None,
                path: str = "/v1/chat/completions") -> tuple[int, dict, aiohttp.ClientResponse]:
    async with aiohttp.ClientSession() as session:
        kwargs = {"data": raw} if raw is not None else {"json": body}
        async with session.post(fleet.url + path, headers=headers, **kwargs) as resp:
            return resp.status, await resp.json(content_type=None), resp


def _assert_openai_error(body: dict) -> None:
    assert set(body) == {"error"}
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert isinstance(body["error"]["type"], str)
    assert "code" in body["error"]


@pytest.mark.router_args(*ERROR_ARGS)
@pytest.mark.parametrize(("kwargs", "status", "code"), [
    ({"raw": b"{not json"}, 400, "invalid_json"),
    ({"raw": b"[1, 2]"}, 400, "invalid_body"),
    ({"body": {"model": MODEL, "messages": []}}, 400, "invalid_prompt"),
    ({"body": {"model": MODEL, "messages": "hi"}}, 400, "invalid_prompt"),
    ({"body": {"model": 7, "messages": [{"role": "user", "content": "x"}]}}, 400,
     "invalid_model"),
    ({"body": {**CHAT, "stream": "yes"}}, 400, "invalid_stream"),
    ({"body": CHAT, "headers": {"X-Context-Hash": "not-hex!"}}, 400, "invalid_prompt"),
    ({"body": CHAT, "headers": {"X-Context-Hash": "abc"}}, 400, "invalid_prompt"),
    ({"body": {"model": MODEL, "prompt": [1, "a"]}, "path": "/v1/completions"}, 400,
     "invalid_prompt"),
    ({"body": {**CHAT, "model": "no-such-model"}}, 404, "model_not_found"),
    ({"raw": b'{"model": "x", "pad": "' + b"a" * 5000 + b'"}'}, 413,
     "request_entity_too_large"),
    ({"body": CHAT, "headers": {"X-Test-Mode": "status-503"}}, 502, "upstream_5xx"),
    ({"body": CHAT, "headers": {"X-Test-Mode": "hang"}}, 504, "upstream_timeout"),
])
async def test_error_classes(fleet: Fleet, kwargs: dict, status: int, code: str) -> None:
    got, body, _ = await _post(fleet, **kwargs)
    assert got == status
    _assert_openai_error(body)
    assert body["error"]["code"] == code


async def test_no_healthy_worker_is_503_with_retry_after(fleet: Fleet) -> None:
    for up in fleet.upstreams:
        up.post("/health/503")
    async with aiohttp.ClientSession() as session:
        for _ in range(200):
            async with session.get(fleet.url + "/ready") as resp:
                if resp.status == 503:
                    break
            await asyncio.sleep(0.05)
        assert resp.status == 503
        async with session.post(fleet.url + "/v1/chat/completions", json=CHAT) as resp:
            assert resp.status == 503
            assert int(resp.headers["Retry-After"]) >= 1
            _assert_openai_error(await resp.json())


async def test_unknown_route_is_an_openai_404(fleet: Fleet) -> None:
    async with aiohttp.ClientSession() as session, session.get(fleet.url + "/v1/nope") as resp:
        assert resp.status == 404
        _assert_openai_error(await resp.json())


async def test_a_workers_error_reaches_the_client_in_openais_shape(fleet: Fleet) -> None:
    """vLLM answers a route the model lacks with FastAPI's ``{"detail": ...}``: an OpenAI
    client must still see an error it can read, with the worker's words and status."""
    status, body, _ = await _post(fleet, CHAT, headers={"X-Test-Mode": "detail-404"})
    assert status == 404
    _assert_openai_error(body)
    assert "Not Found" in body["error"]["message"] and body["error"]["code"] == "upstream_error"
    # a worker without the route at all answers aiohttp's plain-text 404
    status, body, resp = await _post(fleet, {"model": MODEL, "query": "q", "documents": ["d"]},
                                     path="/v1/rerank")
    assert status == 404 and resp.content_type == "application/json"
    _assert_openai_error(body)
    # an answer already in OpenAI's shape passes as the worker made it
    status, body, _ = await _post(fleet, CHAT, headers={"X-Test-Mode": "status-404"})
    assert status == 404 and body["error"]["type"] == "test" and body["error"]["code"] == 404


async def test_models_are_the_union_of_the_workers(fleet: Fleet) -> None:
    async with aiohttp.ClientSession() as session, session.get(fleet.url + "/v1/models") as r:
        listing = await r.json()
    assert [m["id"] for m in listing["data"]] == [MODEL]


async def test_embeddings_pass_through(fleet: Fleet) -> None:
    status, body, _ = await _post(fleet, {"model": MODEL, "input": "x"}, path="/v1/embeddings")
    assert status == 200 and body["served_by"].startswith("w")


async def test_metrics_parse_and_count_what_happened(fleet: Fleet) -> None:
    for _ in range(3):
        await _post(fleet, CHAT)
    async with aiohttp.ClientSession() as session, session.get(fleet.url + "/metrics") as r:
        text = await r.text()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    requests = sum(s.value for s in families["prefix_router_requests"].samples
                   if s.name.endswith("_total"))
    assert requests == 3
    decisions = sum(s.value for s in families["prefix_router_routing_decisions"].samples
                    if s.name.endswith("_total"))
    assert decisions == 3
    healthy = [s for s in families["prefix_router_worker_healthy"].samples]
    assert sorted(s.labels["worker"] for s in healthy) == ["w0", "w1", "w2"]
    assert all(s.value == 1 for s in healthy)
    for name in ("prefix_router_request_latency_seconds", "prefix_router_worker_in_flight",
                 "prefix_router_time_to_first_byte_seconds", "prefix_router_residency_lookups"):
        assert name in families


async def test_admin_routes_are_off_without_a_token(fleet: Fleet) -> None:
    async with aiohttp.ClientSession() as session, session.get(
            fleet.url + "/admin/workers") as resp:
        assert resp.status == 404


def test_invalid_config_fails_at_start_with_one_line_naming_the_field() -> None:
    proc = spawn(["-m", "router", "serve", "--bound-epsilon", "-1", "--workers",
                  "http://127.0.0.1:1"])
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 2
    lines = out.strip().splitlines()
    assert len(lines) == 1 and "bound_epsilon" in lines[0]
    proc = spawn(["-m", "router", "serve"], env={"PREFIX_ROUTER_POLICY": "random"})
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 2 and "policy" in out and len(out.strip().splitlines()) == 1
