"""Precise mode in the router, against scripted upstreams and a vLLM-protocol KV publisher.

The real-vLLM version of these checks is tests/engine/test_precise_vllm.py; here the events
are published by hand, so the expected match is known exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from router.config import RouterConfig
from router.infra.supervisor import SUPERVISOR
from router.precise.exact import block_key
from router.precise.tokenize import PromptTokenizer
from router.protocol.block_hash import block_hashes
from router.routing import keys
from router.server.app import build_app
from router.server.state import ROUTER
from tests.engine.vllm_publisher import FakePublisher, stored
from tests.router.conftest import MODEL, Upstream, start_upstreams
from tests.support import free_port, stop

pytest.importorskip("transformers")
BLOCK = 16
DOC = " ".join(f"word{i % 37} context retrieval block" for i in range(120))


@pytest.fixture(scope="module")
def upstreams() -> Iterator[list[Upstream]]:
    ups = start_upstreams(2)
    yield ups
    for up in ups:
        stop(up.proc)


async def publish_until(pub: FakePublisher, events: list, landed, within_s: float = 20.0
                        ) -> None:
    """PUB drops what it sends before the SUB has connected; an empty batch after it makes
    the subscriber see the gap and fetch the events from the replay socket."""
    await pub.publish(events)
    deadline = time.monotonic() + within_s
    while not landed():
        assert time.monotonic() < deadline, "events never reached the router"
        await asyncio.sleep(0.2)
        await pub.publish([])


@contextlib.asynccontextmanager
async def tasks_shown_after(seconds: float) -> AsyncIterator[None]:
    """Fail after ``seconds`` and print every task's stack. The registry tests below hung
    until pytest-timeout's 300 s once in CI and twice in ~25 runs of this file under CPU
    load here (not in 130 runs since); that traceback shows only the event loop's select:
    this says which await never finished."""
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError:
        for task in asyncio.all_tasks():
            print(f"task {task.get_name()}:", file=sys.stderr)
            task.print_stack(file=sys.stderr)
        raise


async def eventually(check, within_s: float = 20.0) -> None:
    deadline = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def feeds_app(upstreams: list[Upstream], tokenizer_model: str, tokenizer_dir: Path,
                    **settings: object
                    ) -> AsyncIterator[tuple[TestClient, dict[str, FakePublisher]]]:
    """The router in process before ``upstreams``, each with a live KV-event publisher."""
    ports = {u.name: (free_port(), free_port()) for u in upstreams}
    pubs = {name: FakePublisher(f"tcp://127.0.0.1:{p}", f"tcp://127.0.0.1:{r}", topic="kv-events")
            for name, (p, r) in ports.items()}
    config = RouterConfig(
        workers=tuple((u.name, u.url) for u in upstreams),
        tokenizers=((tokenizer_model, str(tokenizer_dir)),), precise_block_size=BLOCK,
        kv_events=tuple((n, f"tcp://127.0.0.1:{p}|tcp://127.0.0.1:{r}")
                        for n, (p, r) in ports.items()),
        health_interval_s=0.2, **settings)  # type: ignore[arg-type]
    for pub in pubs.values():
        await pub.__aenter__()
    client = TestClient(TestServer(build_app(config)))
    await client.start_server()
    try:
        yield client, pubs
    finally:
        await client.close()
        for pub in pubs.values():
            await pub.__aexit__(None, None, None)


@pytest.fixture
async def precise(tokenizer_dir: Path, upstreams: list[Upstream]
                  ) -> AsyncIterator[tuple[TestClient, dict[str, FakePublisher]]]:
    async with feeds_app(upstreams, MODEL, tokenizer_dir) as app:
        yield app


async def test_routes_to_the_worker_whose_events_hold_the_prompt(
        precise: tuple[TestClient, dict[str, FakePublisher]], tokenizer_dir: Path) -> None:
    client, pubs = precise
    state = client.server.app[ROUTER]
    assert state.precise is not None
    await state.precise.feeds.wait_subscribed()
    body = {"model": MODEL, "prompt": DOC + " question: why?", "max_tokens": 1}
    ids = PromptTokenizer(str(tokenizer_dir)).completion_ids(body)
    chain = [block_key(h) for h in block_hashes(ids, BLOCK, seed="0")]
    assert len(chain) >= 8
    held = len(chain) - 2  # w1 holds all but the last two blocks
    await publish_until(pubs["w1"], [stored(chain[:held], block_size=BLOCK)],
                        lambda: state.precise.residency.match("w1", chain) == held)
    resp = await client.post("/v1/completions", json=body)
    assert resp.status == 200
    assert resp.headers["X-Prefix-Router-Worker"] == "w1"
    assert resp.headers["X-Prefix-Router-Reason"] == "warm"
    assert resp.headers["X-Prefix-Router-Predicted-Cached"] == str(held * BLOCK)
    metrics = await (await client.get("/metrics")).text()
    assert 'prefix_router_routing_key_source_total{source="precise"} 1.0' in metrics
    assert f'prefix_router_precise_resident_blocks{{worker="w1"}} {held}.0' in metrics
    assert 'prefix_router_kv_events_total{kind="decode_errors",worker="w1"} 0.0' in metrics


async def test_chat_requests_use_the_chat_template(
        precise: tuple[TestClient, dict[str, FakePublisher]], tokenizer_dir: Path) -> None:
    client, pubs = precise
    state = client.server.app[ROUTER]
    await state.precise.feeds.wait_subscribed()
    body = {"model": MODEL, "messages": [{"role": "system", "content": DOC},
                                         {"role": "user", "content": "and so?"}]}
    ids = PromptTokenizer(str(tokenizer_dir)).chat_ids(body)
    assert ids[:3] != PromptTokenizer(str(tokenizer_dir)).completion_ids(
        {"prompt": DOC})[:3], "the template's role markers come first"
    chain = [block_key(h) for h in block_hashes(ids, BLOCK, seed="0")]
    await publish_until(pubs["w0"], [stored(chain, block_size=BLOCK)],
                        lambda: state.precise.residency.match("w0", chain) == len(chain))
    resp = await client.post("/v1/chat/completions", json=body)
    assert resp.headers["X-Prefix-Router-Worker"] == "w0"
    expected = min(len(chain), (len(ids) - 1) // BLOCK) * BLOCK
    assert resp.headers["X-Prefix-Router-Predicted-Cached"] == str(expected)


async def test_a_model_without_a_tokenizer_routes_on_text(
        tokenizer_dir: Path, upstreams: list[Upstream]) -> None:
    config = RouterConfig(workers=tuple((u.name, u.url) for u in upstreams),
                          tokenizers=(("another-model", str(tokenizer_dir)),),
                          health_interval_s=0.2)
    async with TestClient(TestServer(build_app(config))) as client:
        resp = await client.post("/v1/completions", json={"model": MODEL, "prompt": DOC})
        assert resp.status == 200
        assert "X-Prefix-Router-Predicted-Cached" not in resp.headers
        metrics = await (await client.get("/metrics")).text()
        assert 'prefix_router_routing_key_source_total{source="prompt"} 1.0' in metrics


def test_precise_settings_parse_from_flags_env_and_yaml(tmp_path: Path) -> None:
    from router.config import ConfigError, load_config

    config = load_config({"tokenizers": "llama=/models/llama, qwen=/models/qwen",
                          "kv_events": "w0=tcp://10.0.0.1:5557|tcp://10.0.0.1:5558"}, env={})
    assert config.tokenizers == (("llama", "/models/llama"), ("qwen", "/models/qwen"))
    assert config.kv_events == (("w0", "tcp://10.0.0.1:5557|tcp://10.0.0.1:5558"),)
    env = load_config({}, env={"PREFIX_ROUTER_TOKENIZERS": "m=/d",
                               "PREFIX_ROUTER_PRECISE_BLOCK_SIZE": "32"})
    assert env.tokenizers == (("m", "/d"),) and env.precise_block_size == 32
    yaml_file = tmp_path / "router.yaml"
    yaml_file.write_text("tokenizers: {m: /d}\nkv_events: ['a=tcp://h:1']\n")
    from_yaml = load_config({"config": str(yaml_file)}, env={})
    assert from_yaml.tokenizers == (("m", "/d"),)
    assert from_yaml.kv_events == (("a", "tcp://h:1"),)
    with pytest.raises(ConfigError, match="tokenizers"):
        load_config({"tokenizers": "no-directory"}, env={})


ADMIN = {"Authorization": "Bearer s3cret"}
TEXT_BODY = {"model": MODEL, "prompt": DOC, "max_tokens": 1}


def text_context(config: RouterConfig) -> keys.RoutingKey:
    """The text-mode routing key of TEXT_BODY: its ring context and residency chain."""
    return keys.prompt_key(TEXT_BODY["prompt"].encode(), MODEL, config.block_chars,
                           config.max_blocks, config.key_blocks)


async def assert_known(app: web.Application, worker_id: str, key: keys.RoutingKey) -> None:
    """What a worker would leave behind, all of it present (so that its absence later
    means something)."""
    state = app[ROUTER]
    assert state.precise.feeds.params(worker_id) is not None
    assert f"kv-events:{worker_id}" in app[SUPERVISOR].names()
    assert state.precise.residency.count(worker_id) > 0
    assert (await state.residency.match(key.chain, [worker_id])).get(worker_id)
    assert worker_id in state.pipeline.policy.replicas.live(key.key)


async def assert_forgotten(app: web.Application, worker_id: str, key: keys.RoutingKey,
                           pub: FakePublisher) -> None:
    """Everything the pool hooks own: the KV-event feed (stopped: what the worker publishes
    now lands nowhere), exact and text residency, hot-prefix replicas."""
    state = app[ROUTER]
    assert state.precise.feeds.params(worker_id) is None
    assert state.precise.feeds.subscriber(worker_id) is None
    assert f"kv-events:{worker_id}" not in app[SUPERVISOR].names()
    assert worker_id not in state.pipeline.policy.replicas.live(key.key)
    await pub.publish([stored([11, 12, 13], block_size=BLOCK)])
    await asyncio.sleep(0.5)  # also lets a Redis residency store flush the forget
    assert state.precise.residency.count(worker_id) == 0
    assert await state.residency.match(key.chain, [worker_id]) == {}


@pytest.fixture
async def admin_feeds(tokenizer_dir: Path, upstreams: list[Upstream]
                      ) -> AsyncIterator[tuple[TestClient, dict[str, FakePublisher]]]:
    """Static workers with KV-event feeds, the admin API on; MODEL has no tokenizer, so its
    requests route on text and leave text residency and replicas behind as well."""
    async with feeds_app(upstreams, "another-model", tokenizer_dir,
                         admin_token="s3cret") as app:
        yield app


async def test_admin_removal_stops_the_feed_and_forgets_the_worker(
        admin_feeds: tuple[TestClient, dict[str, FakePublisher]]) -> None:
    client, pubs = admin_feeds
    state = client.server.app[ROUTER]
    await state.precise.feeds.wait_subscribed()
    await publish_until(pubs["w1"], [stored([1, 2, 3], block_size=BLOCK)],
                        lambda: state.precise.residency.count("w1") == 3)
    assert (await client.post("/admin/workers/w0/drain", headers=ADMIN)).status == 200
    resp = await client.post("/v1/completions", json=TEXT_BODY)
    assert resp.status == 200 and resp.headers["X-Prefix-Router-Worker"] == "w1"
    key = text_context(state.config)
    await eventually(lambda: state.residency.stamp("w1", key.chain[0]) is not None)
    await assert_known(client.server.app, "w1", key)

    assert (await client.delete("/admin/workers/w1", headers=ADMIN)).status == 204
    assert state.pool.get("w1") is None
    await assert_forgotten(client.server.app, "w1", key, pubs["w1"])
    metrics = await (await client.get("/metrics")).text()
    assert 'prefix_router_precise_resident_blocks{worker="w1"}' not in metrics
    assert state.precise.feeds.params("w0") is not None  # the other worker's feed stays


async def test_registry_workers_get_a_feed_with_their_own_hash_parameters(
        redis_server, tokenizer_dir: Path) -> None:  # type: ignore[no-untyped-def]
    from router.infra.redis_client import make_client
    from router.protocol import registry
    from router.protocol.kv_feed import FeedParams
    from router.protocol.registry import WorkerRecord

    config = RouterConfig(redis_url=redis_server.url, discover=True, registry_poll_s=0.1,
                          tokenizers=((MODEL, str(tokenizer_dir)),))
    redis = make_client(redis_server.url)
    record = WorkerRecord(id="r1", url="http://127.0.0.1:9", models=(MODEL,), block_size=32,
                          kv_events_endpoint="tcp://10.0.0.7:5557",
                          extra={"hash_algo": "sha256_cbor", "hash_seed": "7",
                                 "kv_events_replay_endpoint": "tcp://10.0.0.7:5558",
                                 "kv_events_topic": "kv-events"})
    try:
        async with tasks_shown_after(90), TestClient(TestServer(build_app(config))) as client:
            state = client.server.app[ROUTER]
            await registry.publish(redis, record, ttl_s=1.0)
            await eventually(lambda: state.precise.feeds.params("r1") is not None)
            assert state.precise.feeds.params("r1") == FeedParams(
                "tcp://10.0.0.7:5557", "tcp://10.0.0.7:5558", "kv-events", 32, "7")
            await eventually(lambda: state.pool.get("r1") is None, within_s=10)
            assert state.precise.feeds.params("r1") is None  # heartbeat lapsed: unsubscribed
    finally:
        await redis.aclose()


async def test_discovery_removal_goes_through_the_same_hooks(
        redis_server, tokenizer_dir: Path,  # type: ignore[no-untyped-def]
        upstreams: list[Upstream]) -> None:
    """A registry worker whose heartbeat lapses leaves like an admin-removed one: feed
    stopped, exact, shared (Redis) and local residency forgotten, replicas dropped."""
    from router.infra.redis_client import make_client
    from router.protocol import registry
    from router.protocol.registry import WorkerRecord

    events, replay = free_port(), free_port()
    config = RouterConfig(redis_url=redis_server.url, discover=True, registry_poll_s=0.1,
                          tokenizers=(("another-model", str(tokenizer_dir)),),
                          health_interval_s=0.2)
    record = WorkerRecord(id="r1", url=upstreams[1].url, models=(MODEL,), block_size=BLOCK,
                          kv_events_endpoint=f"tcp://127.0.0.1:{events}",
                          extra={"kv_events_replay_endpoint": f"tcp://127.0.0.1:{replay}",
                                 "kv_events_topic": "kv-events", "hash_seed": "0"})
    redis = make_client(redis_server.url)
    pub = FakePublisher(f"tcp://127.0.0.1:{events}", f"tcp://127.0.0.1:{replay}",
                        topic="kv-events")
    try:
        async with tasks_shown_after(90), pub, TestClient(TestServer(build_app(config))) as client:
            state = client.server.app[ROUTER]
            await registry.publish(redis, record, ttl_s=30.0)
            await eventually(lambda: (w := state.pool.get("r1")) is not None and w.healthy)
            await state.precise.feeds.wait_subscribed()
            await publish_until(pub, [stored([1, 2, 3], block_size=BLOCK)],
                                lambda: state.precise.residency.count("r1") == 3)
            resp = await client.post("/v1/completions", json=TEXT_BODY)
            assert resp.status == 200 and resp.headers["X-Prefix-Router-Worker"] == "r1"
            key = text_context(config)
            await eventually(lambda: state.residency.stamp("r1", key.chain[0]) is not None)
            await assert_known(client.server.app, "r1", key)

            await registry.publish(redis, record, ttl_s=0.3)  # the last heartbeat
            await eventually(lambda: state.pool.get("r1") is None, within_s=10)
            await assert_forgotten(client.server.app, "r1", key, pub)
    finally:
        await redis.aclose()


def test_kv_event_sources_as_vllm_lists_them() -> None:
    """vLLM's GET /kv_event_sources: a bare array or {"sources": [...]}; bind addresses
    become the worker's host; no source: no feed; several data-parallel ranks: refused."""
    from router.protocol.kv_feed import FeedParams, SourcesError, feed_from_sources

    source = {"data_parallel_rank": 0, "endpoint": "tcp://0.0.0.0:41001",
              "replay_endpoint": "tcp://*:41003", "topic": "kv-events"}
    want = FeedParams("tcp://10.0.0.7:41001", "tcp://10.0.0.7:41003", "kv-events", 16, "0")
    assert feed_from_sources([source], "https://10.0.0.7:8000", 16, "0") == want
    assert feed_from_sources({"sources": [source]}, "http://10.0.0.7:8000", 16, "0") == want
    v6 = feed_from_sources([{**source, "replay_endpoint": None}], "http://[fd00::7]:8000",
                           32, "1")
    assert v6 == FeedParams("tcp://[fd00::7]:41001", None, "kv-events", 32, "1")
    named = feed_from_sources([{**source, "endpoint": "tcp://w3:5557"}], "http://x:1", 16, "0")
    assert named is not None and named.endpoint == "tcp://w3:5557"
    assert feed_from_sources([], "http://x:1", 16, "0") is None
    for bad in ([source, {**source, "data_parallel_rank": 1}], {"sources": "x"},
                [{"endpoint": ""}]):
        with pytest.raises(SourcesError):
            feed_from_sources(bad, "http://x:1", 16, "0")
