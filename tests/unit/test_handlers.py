"""The router app in process before three fake workers: bodies, errors, streams, stickiness."""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson
import pytest
from aiohttp.test_utils import TestClient

from tests.unit.fakes import MODEL, FakeWorker, chat_body, fake_workers, router_client

DOC = "PagedAttention keeps each sequence's KV cache in fixed-size blocks. " * 40
REASONS = {"warm", "home", "ring", "spill", "replicate", "cold"}


@pytest.fixture
async def workers() -> AsyncIterator[list[FakeWorker]]:
    async with fake_workers(3) as fakes:
        yield fakes


@pytest.fixture
async def client(workers: list[FakeWorker]) -> AsyncIterator[TestClient]:
    async with router_client(workers) as c:
        yield c


def by_name(workers: list[FakeWorker], name: str) -> FakeWorker:
    return next(w for w in workers if w.name == name)


def assert_openai_error(body: bytes, code: str, type_: str) -> None:
    error = orjson.loads(body)["error"]
    assert {"message", "type", "code"} <= error.keys()
    assert isinstance(error["message"], str) and error["message"]
    assert (error["code"], error["type"]) == (code, type_)


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", orjson.dumps(chat_body(DOC + "What is a block?"))),
    ("/v1/completions", orjson.dumps({"model": MODEL, "prompt": DOC, "max_tokens": 4})),
])
async def test_routed_answer_is_the_upstreams_body_unchanged(
        client: TestClient, workers: list[FakeWorker], path: str, body: bytes) -> None:
    async with client.post(path, data=body, headers={"X-Request-Id": "req-1"}) as resp:
        got = await resp.read()
        assert resp.status == 200
        served = by_name(workers, resp.headers["X-Prefix-Router-Worker"])
        assert resp.headers["X-Prefix-Router-Reason"] in REASONS
        assert resp.headers["X-Request-Id"] == "req-1"
    assert sum(len(w.received) for w in workers) == 1
    upstream_path, upstream_body, upstream_headers = served.received[0]
    assert (upstream_path, upstream_body) == (path, body)  # the request's bytes, forwarded
    assert upstream_headers["X-Request-Id"] == "req-1"
    assert got == served.sent[0]  # the answer's bytes, relayed
    assert orjson.loads(got)["served_by"] == served.name


BAD_REQUESTS = [
    # (path, body, headers, status, code, type)
    ("/v1/chat/completions", b"{not json", {}, 400, "invalid_json", "invalid_request_error"),
    ("/v1/completions", b"[1, 2]", {}, 400, "invalid_body", "invalid_request_error"),
    ("/v1/chat/completions", orjson.dumps({**chat_body("hi"), "stream": "yes"}), {}, 400,
     "invalid_stream", "invalid_request_error"),
    ("/v1/completions", orjson.dumps({"model": 7, "prompt": "hi"}), {}, 400, "invalid_model",
     "invalid_request_error"),
    ("/v1/chat/completions", orjson.dumps(chat_body("hi", model="nobody-serves-this")), {},
     404, "model_not_found", "not_found_error"),
    ("/v1/chat/completions", orjson.dumps({"model": MODEL, "messages": []}), {}, 400,
     "invalid_prompt", "invalid_request_error"),
    ("/v1/completions", orjson.dumps({"model": MODEL, "prompt": 12}), {}, 400,
     "invalid_prompt", "invalid_request_error"),
    ("/v1/chat/completions", orjson.dumps(chat_body("hi")), {"X-Context-Hash": "not-hex!"},
     400, "invalid_prompt", "invalid_request_error"),
    ("/v1/chat/completions", orjson.dumps(chat_body("hi")), {"X-Context-Hash": "abc123"},
     400, "invalid_prompt", "invalid_request_error"),  # 6 hex: too short
]


@pytest.mark.parametrize("path, body, headers, status, code, type_", BAD_REQUESTS)
async def test_bad_requests_get_openai_errors_and_reach_no_worker(
        client: TestClient, workers: list[FakeWorker], path: str, body: bytes,
        headers: dict[str, str], status: int, code: str, type_: str) -> None:
    async with client.post(path, data=body, headers=headers) as resp:
        assert resp.status == status
        assert resp.headers["Content-Type"].startswith("application/json")
        assert resp.headers["X-Request-Id"]
        assert "X-Prefix-Router-Worker" not in resp.headers
        assert_openai_error(await resp.read(), code, type_)
    assert all(not w.received for w in workers)


async def test_a_body_over_max_body_bytes_is_a_413(workers: list[FakeWorker]) -> None:
    async with router_client(workers, max_body_bytes=1024) as c, \
            c.post("/v1/completions", json={"model": MODEL, "prompt": "x" * 2048}) as resp:
        assert resp.status == 413
        assert resp.headers["X-Request-Id"]
        assert_openai_error(await resp.read(), "request_entity_too_large",
                            "invalid_request_error")
    assert all(not w.received for w in workers)


async def test_a_valid_context_hash_is_accepted_and_not_forwarded(
        client: TestClient, workers: list[FakeWorker]) -> None:
    async with client.post("/v1/chat/completions", json=chat_body("hi"),
                           headers={"X-Context-Hash": "DeadBeef" * 4}) as resp:
        assert resp.status == 200
    (_, _, upstream_headers), = [r for w in workers for r in w.received]
    assert "X-Context-Hash" not in upstream_headers


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", chat_body(DOC, stream=True)),
    ("/v1/completions", {"model": MODEL, "prompt": DOC, "stream": True,
                         "stream_options": {"include_usage": True}}),
])
async def test_a_stream_is_relayed_in_order_and_ends_with_done(
        client: TestClient, workers: list[FakeWorker], path: str, body: dict) -> None:
    async with client.post(path, json=body) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        assert resp.headers["X-Request-Id"]
        served = by_name(workers, resp.headers["X-Prefix-Router-Worker"])
        raw = await resp.read()
    assert raw == served.sent[0]
    events = [e.removeprefix(b"data: ") for e in raw.split(b"\n\n") if e]
    assert events[-1] == b"[DONE]"
    chunks = [orjson.loads(e) for e in events[:-1]]
    texts = [c["choices"][0]["delta"]["content"] if "delta" in c["choices"][0]
             else c["choices"][0]["text"] for c in chunks if c["choices"]]
    assert "".join(texts) == "Hello world"
    assert chunks[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] >= 0


async def test_the_same_document_twice_goes_to_the_same_worker_warm(
        client: TestClient, workers: list[FakeWorker]) -> None:
    served = []
    for question in ("What is a block?", "What is a block?", "How big is a block?"):
        async with client.post("/v1/chat/completions",
                               json=chat_body(DOC + question)) as resp:
            assert resp.status == 200
            served.append((resp.headers["X-Prefix-Router-Worker"],
                           resp.headers["X-Prefix-Router-Reason"]))
    (first, reason), (second, again), (third, _) = served
    assert reason == "ring"
    assert (second, again) == (first, "warm")
    assert third == first  # the shared document keeps the new question there too
    usage = orjson.loads(by_name(workers, first).sent[1])["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] > 0


async def test_an_upstream_500_fails_over_to_the_next_worker(
        client: TestClient, workers: list[FakeWorker]) -> None:
    body = chat_body(DOC + "Fail over?")
    async with client.post("/v1/chat/completions", json=body) as resp:
        home = by_name(workers, resp.headers["X-Prefix-Router-Worker"])
    home.status = 500  # the context's home now fails: it is still ranked first
    async with client.post("/v1/chat/completions", json=body) as resp:
        assert resp.status == 200
        served = resp.headers["X-Prefix-Router-Worker"]
        assert resp.headers["X-Prefix-Router-Reason"] == "failover"
        got = await resp.read()
    assert served != home.name
    assert len(home.received) == 2  # it was tried, and answered 500
    assert got == by_name(workers, served).sent[-1]


async def test_models_is_the_union_of_the_workers_models() -> None:
    async with fake_workers(2) as fakes:
        fakes[1].model = "other-model"
        async with router_client(fakes) as c, c.get("/v1/models") as resp:
            assert resp.status == 200
            ids = [m["id"] for m in (await resp.json())["data"]]
    assert ids == sorted([MODEL, "other-model"])


@pytest.mark.parametrize("method, path, body, status", [
    ("GET", "/health", None, 200),
    ("GET", "/ready", None, 200),
    ("GET", "/v1/models", None, 200),
    ("GET", "/metrics", None, 200),
    ("GET", "/no/such/route", None, 404),
    ("GET", "/v1/chat/completions", None, 405),
    ("POST", "/v1/chat/completions", b"{", 400),
    ("POST", "/v1/chat/completions", orjson.dumps(chat_body("hi")), 200),
    ("POST", "/v1/chat/completions", orjson.dumps(chat_body("hi", stream=True)), 200),
])
async def test_every_response_has_a_request_id(client: TestClient, method: str, path: str,
                                               body: bytes | None, status: int) -> None:
    async with client.request(method, path, data=body) as resp:
        assert resp.status == status
        generated = resp.headers["X-Request-Id"]
    assert generated
    async with client.request(method, path, data=body,
                              headers={"X-Request-Id": "client.id-7"}) as resp:
        assert resp.headers["X-Request-Id"] == "client.id-7"
    async with client.request(method, path, data=body,
                              headers={"X-Request-Id": "bad id with spaces"}) as resp:
        replaced = resp.headers["X-Request-Id"]
    assert replaced and replaced != "bad id with spaces"
