"""The simulator as a real process over real HTTP: API shape, streaming, metrics, Redis."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from router.protocol import registry
from tests.support import free_port, spawn, stop, wait_http

DOC = " ".join(f"word{i} is here." for i in range(400))


def start_sim(*extra: str) -> tuple[str, object, int]:
    port = free_port()
    proc = spawn(["-m", "engine_worker.sim", "--host", "127.0.0.1", "--port", str(port),
                  "--model", "sim-a", "--profile", "llama-3-8b@h100-80gb",
                  "--time-scale", "0.01", *extra], env={"PYTHONHASHSEED": "0"})
    wait_http(f"http://127.0.0.1:{port}/health", proc=proc)
    return f"http://127.0.0.1:{port}", proc, port


@pytest.fixture
def sim() -> Iterator[str]:
    url, proc, _ = start_sim()
    yield url
    stop(proc)


async def sse(resp: aiohttp.ClientResponse) -> list[bytes]:
    raw = await resp.read()
    assert raw.endswith(b"data: [DONE]\n\n")
    return [part for part in raw.split(b"\n\n") if part]


def metric(text: str, name: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    raise AssertionError(f"{name} missing")


async def test_completions_streaming_metrics_and_errors(sim: str) -> None:
    async with aiohttp.ClientSession() as http:
        body = {"model": "sim-a", "prompt": DOC, "max_tokens": 5}
        cached, ids = [], []
        for _ in range(2):
            async with http.post(f"{sim}/v1/completions", json=body) as resp:
                assert resp.status == 200
                data = await resp.json()
            ids.append(data["id"])
            assert data["usage"]["completion_tokens"] == 5
            assert data["usage"]["total_tokens"] == data["usage"]["prompt_tokens"] + 5
            cached.append(data["usage"]["prompt_tokens_details"]["cached_tokens"])
        prompt_tokens = data["usage"]["prompt_tokens"]
        assert cached == [0, (prompt_tokens - 1) // 16 * 16]
        async with http.get(f"{sim}/metrics") as resp:
            text = await resp.text()
        assert metric(text, "vllm:prefix_cache_hits_total") == sum(cached)
        assert metric(text, "vllm:prefix_cache_queries_total") == 2 * prompt_tokens
        assert metric(text, "vllm:generation_tokens_total") == 10
        assert metric(text, "vllm:time_to_first_token_seconds_count") == 2
        names = {f.name for f in text_string_to_metric_families(text)}
        assert {"vllm:kv_cache_usage_perc", "vllm:num_requests_running",
                "vllm:num_requests_waiting", "vllm:e2e_request_latency_seconds",
                "vllm:num_preemptions", "vllm:cache_config_info"} <= names

        stream_body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        streams = []
        for _ in range(2):
            async with http.post(f"{sim}/v1/completions", json=stream_body) as resp:
                assert resp.headers["Content-Type"].startswith("text/event-stream")
                streams.append(await sse(resp))
        events = [orjson.loads(p.removeprefix(b"data: ")) for p in streams[0][:-1]]
        assert "".join(e["choices"][0]["text"] for e in events if e["choices"]) == \
            data["choices"][0]["text"]
        assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 5
        strip = [[{**orjson.loads(p[6:]), "id": "", "created": 0} for p in s[:-1]] for s in streams]
        assert strip[0] == strip[1]          # deterministic text, byte for byte
        assert events[0]["id"] != orjson.loads(streams[1][0][6:])["id"]
        # the simulator's request log: each request's engine TTFT under the id its client
        # saw, the same TTFTs its histogram summed
        ids += [orjson.loads(s[0][6:])["id"] for s in streams]
        async with http.get(f"{sim}/sim/requests") as resp:
            served = await resp.json()
        assert [r["id"] for r in served] == ids
        assert [r["cached_tokens"] for r in served[:2]] == cached
        assert {r["prompt_tokens"] for r in served} == {prompt_tokens}
        assert sum(r["ttft_s"] for r in served[:2]) == pytest.approx(
            metric(text, "vllm:time_to_first_token_seconds_sum"))
        assert all(r["server_ttft_s"] > 0 for r in served)

        chat = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 3,
                "stream": True, "n": 2}
        async with http.post(f"{sim}/v1/chat/completions", json=chat) as resp:
            parts = await sse(resp)
        chunks = [orjson.loads(p[6:]) for p in parts[:-1]]
        assert {c["choices"][0]["index"] for c in chunks} == {0, 1}
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"

        async with http.post(f"{sim}/v1/completions", json={**body, "model": "nope"}) as resp:
            assert resp.status == 404
            assert (await resp.json())["error"]["code"] == 404
        async with http.post(f"{sim}/v1/completions", data=b"{bad") as resp:
            assert resp.status == 400
        async with http.post(f"{sim}/v1/completions", json={**body, "max_tokens": -1}) as resp:
            assert resp.status == 400
        async with http.get(f"{sim}/v1/models") as resp:
            assert (await resp.json())["data"][0]["id"] == "sim-a"
        async with http.post(f"{sim}/tokenize", json={"prompt": DOC}) as resp:
            assert (await resp.json())["count"] == prompt_tokens


async def test_fail_after_cuts_open_streams() -> None:
    url, proc, _ = start_sim("--fail-after", "1")
    try:
        async with aiohttp.ClientSession() as http:
            body = {"prompt": "a b c", "max_tokens": 50, "stream": True}
            async with http.post(f"{url}/v1/completions", json=body) as resp:
                assert resp.status == 200
                await resp.read()
            with pytest.raises(aiohttp.ClientError):
                async with http.post(f"{url}/v1/completions", json=body) as resp:
                    raw = await resp.read()
                    assert b"[DONE]" in raw  # never reached: the stream is cut
        proc.wait(timeout=10)
        assert proc.returncode != 0
    finally:
        stop(proc)


async def test_a_client_leaving_mid_stream_frees_its_request_without_an_error(
        tmp_path: Path) -> None:
    """A load test's cancelled stream is routine: vLLM aborts the request quietly. The
    simulator logged a traceback for every write to the closed connection."""
    port, log = free_port(), tmp_path / "sim.log"
    proc = spawn(["-m", "engine_worker.sim", "--host", "127.0.0.1", "--port", str(port),
                  "--model", "sim-a", "--profile", "llama-3-8b@h100-80gb",
                  "--time-scale", "1"], log=log)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/health", proc=proc)
        async with aiohttp.ClientSession() as http:
            body = {"prompt": "a b c", "max_tokens": 3000, "stream": True}
            async with http.post(f"{url}/v1/completions", json=body) as resp:
                await resp.content.readline()  # streaming has begun; then hang up
            running = 1.0
            for _ in range(200):
                async with http.get(f"{url}/metrics") as resp:
                    families = text_string_to_metric_families(await resp.text())
                    running = next(s.value for f in families for s in f.samples
                                   if s.name == "vllm:num_requests_running")
                if running == 0:
                    break
                await asyncio.sleep(0.05)
        assert running == 0
    finally:
        stop(proc)
    assert "Traceback" not in log.read_text()


async def test_registers_in_redis_and_deregisters_on_sigterm(redis_server) -> None:
    events, replay = free_port(), free_port()
    url, proc, port = start_sim("--register-redis", redis_server.url,
                                "--kv-events-endpoint", f"tcp://*:{events}",
                                "--kv-events-replay-endpoint", f"tcp://*:{replay}",
                                "--kv-events-topic", "kv-events")
    from redis.asyncio import Redis

    from router.protocol.kv_feed import FeedParams
    from router.server.precise_ctx import record_feed_params

    client = Redis.from_url(redis_server.url)
    try:
        # it registers right after it starts serving: give it a moment past /health
        records = await registry.read_live(client)
        for _ in range(100):
            if records:
                break
            await asyncio.sleep(0.1)
            records = await registry.read_live(client)
        assert [r.id for r in records] == [f"sim-{port}"]
        record = records[0]
        assert record.url == url and record.models == ("sim-a",)
        assert record.block_size == 16 and record.capacity_blocks == 26674
        # what a precise router subscribes with: dialable endpoints, not the wildcards bound
        assert record_feed_params(record) == FeedParams(
            f"tcp://127.0.0.1:{events}", f"tcp://127.0.0.1:{replay}", "kv-events", 16, "0")
        stop(proc)
        assert proc.returncode == 0
        # The process deregisters before it exits, so the entry is already gone.
        assert await registry.read_live(client) == []
    finally:
        stop(proc)
        await client.aclose()


async def test_chat_continues_a_final_assistant_message_as_vllm_does(sim: str) -> None:
    """continue_final_message with add_generation_prompt=false renders the partial reply
    open-ended: the same prompt as the template's text up to its last character."""
    partial = [{"role": "user", "content": "tell me"}, {"role": "assistant", "content": "Once"}]
    open_ended = "<|user|>\ntell me\n<|assistant|>\nOnce"
    async with aiohttp.ClientSession() as http:
        async def prompt_tokens(path: str, body: dict) -> int:
            async with http.post(sim + path, json={"model": "sim-a", "max_tokens": 1,
                                                   **body}) as resp:
                assert resp.status == 200, await resp.text()
                return (await resp.json())["usage"]["prompt_tokens"]

        continued = await prompt_tokens("/v1/chat/completions", {
            "messages": partial, "continue_final_message": True,
            "add_generation_prompt": False})
        assert continued == await prompt_tokens("/v1/completions", {"prompt": open_ended})
        assert await prompt_tokens("/v1/chat/completions", {"messages": partial}) > continued
        async with http.post(sim + "/v1/chat/completions", json={
                "model": "sim-a", "messages": partial, "continue_final_message": True}) as resp:
            assert resp.status == 400  # add_generation_prompt defaults to true, as in vLLM
