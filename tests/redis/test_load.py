"""Shared load between replicas (real Redis) and the engine-scrape arithmetic."""

from __future__ import annotations

import asyncio

from router.config import RouterConfig
from router.fleet.load import LoadSharer, LoadView
from router.infra.redis_client import make_client
from router.protocol import vllm_metrics
from router.server.app import build_app
from router.server.state import ROUTER, RouterState

WORKERS = (("w0", "http://127.0.0.1:1"), ("w1", "http://127.0.0.1:2"))


def replica(url: str) -> RouterState:
    return build_app(RouterConfig(redis_url=url, workers=WORKERS))[ROUTER]


async def test_replicas_see_each_others_in_flight(redis_server) -> None:
    a, b = replica(redis_server.url), replica(redis_server.url)
    clients = [make_client(redis_server.url) for _ in range(2)]
    sa = LoadSharer(a, clients[0], view_a := LoadView(a))
    sb = LoadSharer(b, clients[1], LoadView(b))
    a.pool.get("w0").in_flight = 3  # type: ignore[union-attr]
    for _ in range(4):
        sa.sample()
    await sa.tick()  # publishes a's mean in-flight (3 on w0)
    await sb.tick()  # learns of a
    await sb.tick()  # reads a's hash
    assert b.pool.get("w0").external_load == 3  # type: ignore[union-attr]
    assert b.pool.get("w1").external_load == 0  # type: ignore[union-attr]
    a.pool.get("w0").in_flight = 0  # type: ignore[union-attr]
    await sa.tick()
    await sb.tick()
    assert b.pool.get("w0").external_load == 0  # type: ignore[union-attr]
    await sa.tick()
    # a never counts its own published load as external
    assert a.pool.get("w0").external_load == 0  # type: ignore[union-attr]
    await sb.withdraw()
    assert redis_server.client().zrange("prefix-router:replicas", 0, -1) == [
        sa.replica_id.encode()]
    assert view_a.others == {}
    for c in clients:
        await c.aclose()


def test_engine_scrape_is_smoothed_and_net_of_our_own() -> None:
    text = ('# HELP vllm:num_requests_running Number of requests\n'
            'vllm:num_requests_running{model_name="m"} 4.0\n'
            'vllm:num_requests_waiting{model_name="m"} 2.0\n'
            'vllm:num_requests_running_total 99\n')
    assert vllm_metrics.parse(text).in_flight == 6
    assert not vllm_metrics.parse("other 1\n").has_queue
    state = build_app(RouterConfig(workers=WORKERS))[ROUTER]
    view = LoadView(state)
    view.observe_engine("w0", 1)  # one request caught once: noise, rounds away
    view.apply()
    assert state.pool.get("w0").external_load == 0  # type: ignore[union-attr]
    for _ in range(6):  # sustained traffic that bypasses the routers shows
        view.observe_engine("w0", 5)
    view.apply()
    assert state.pool.get("w0").external_load == 4  # type: ignore[union-attr]


async def test_engine_kv_capacity_caps_residency() -> None:
    """A scraped ``vllm:cache_config_info`` caps the worker's tracked blocks (no config)."""
    text = ('vllm:cache_config_info{block_size="16",enable_prefix_caching="True",'
            'num_gpu_blocks="1000"} 1.0\n')
    stats = vllm_metrics.parse(text)
    assert (stats.capacity_blocks, stats.block_size) == (1000, 16)
    assert vllm_metrics.parse("vllm:num_requests_running 0\n").capacity_blocks is None
    state = build_app(RouterConfig(workers=WORKERS))[ROUTER]
    worker = state.pool.get("w0")
    assert worker is not None
    state.apply_capacity(worker, 1000, 16)
    chain = tuple(i.to_bytes(8, "big") for i in range(1, 400))
    state.residency.record("w0", chain)
    await asyncio.sleep(0)
    # 1,000 blocks x 16 tokens x 4 bytes (before any usage is learned) / 256-byte blocks
    # = 250 chain blocks kept, the head
    assert state.residency.resident_blocks("w0") == 250  # type: ignore[attr-defined]
    assert (await state.residency.match(chain, ["w0"]))["w0"] == 250


def test_a_data_parallel_worker_counts_every_engine() -> None:
    """One series per engine: capacity and queues are summed, usage averaged."""
    text = "".join(
        f'vllm:cache_config_info{{block_size="16",engine="{e}",num_gpu_blocks="1000"}} 1.0\n'
        f'vllm:num_requests_running{{engine="{e}"}} {e + 1}\n'
        f'vllm:num_requests_waiting{{engine="{e}"}} 1\n'
        f'vllm:kv_cache_usage_perc{{engine="{e}"}} {0.2 * (e + 1)}\n' for e in range(2))
    stats = vllm_metrics.parse(text + "vllm:num_requests_waiting NaN\n")
    assert (stats.capacity_blocks, stats.running, stats.waiting) == (2000, 3, 2)
    assert abs(stats.kv_usage - 0.3) < 1e-9
