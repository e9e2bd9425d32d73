"""The proxy over real HTTP with real upstream processes: streaming, failover, cancellation."""

from __future__ import annotations

import asyncio
import gzip
import json
import signal
import time

import aiohttp
import pytest

from tests.router.conftest import MODEL, Fleet
from tests.support import stop
from tests.upstream_server import event

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}]}


async def _poll(predicate, limit_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + limit_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.05)


async def test_stream_is_relayed_byte_identical_as_events_are_produced(fleet: Fleet) -> None:
    body = {**CHAT, "stream": True}
    headers = {"X-Test-Mode": "stream", "X-Test-Gate": "1", "X-Test-Events": "5"}
    async with aiohttp.ClientSession() as session, session.post(
            fleet.url + "/v1/chat/completions", json=body, headers=headers) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        first = await resp.content.readuntil(b"\n\n")
        # the upstream is still blocked after its first event: we can only have it if the
        # router relayed it as it came, not at the end
        assert first == event(0)
        fleet.by_name(resp.headers["X-Prefix-Router-Worker"]).post("/release")
        rest = await resp.content.read()
    assert first + rest == b"".join(event(i) for i in range(5)) + b"data: [DONE]\n\n"


async def test_request_id_is_propagated_or_generated(fleet: Fleet) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.post(fleet.url + "/v1/chat/completions", json=CHAT,
                                headers={"X-Request-Id": "req-42"}) as resp:
            assert resp.headers["X-Request-Id"] == "req-42"
            worker = fleet.by_name(resp.headers["X-Prefix-Router-Worker"])
        seen = {k.lower(): v for k, v in worker.stats()["headers"].items()}
        assert seen["x-request-id"] == "req-42"
        async with session.post(fleet.url + "/v1/chat/completions", json=CHAT) as resp:
            assert len(resp.headers["X-Request-Id"]) >= 16


async def test_a_gzipped_body_reaches_the_worker_decoded_without_its_encoding(
        fleet: Fleet) -> None:
    """The router forwards the body aiohttp decoded, so the client's Content-Encoding (and
    its Expect, answered here) must not go with it: the worker would gunzip plain JSON
    (found by tests/fuzz: a valid gzipped request came back 502)."""
    raw = json.dumps(CHAT).encode()
    async with aiohttp.ClientSession() as session, session.post(
            fleet.url + "/v1/chat/completions", data=gzip.compress(raw), expect100=True,
            headers={"Content-Encoding": "gzip", "Content-Type": "application/json"}) as resp:
        assert resp.status == 200, await resp.text()
        worker = fleet.by_name(resp.headers["X-Prefix-Router-Worker"])
    stats = worker.stats()
    seen = {k.lower() for k in stats["headers"]}
    assert stats["last_body"] == raw.decode()
    assert "content-encoding" not in seen and "expect" not in seen


async def test_client_disconnect_cancels_the_upstream_request(fleet: Fleet) -> None:
    async with aiohttp.ClientSession() as session:
        with pytest.raises(TimeoutError):
            async with session.post(fleet.url + "/v1/chat/completions", json=CHAT,
                                    headers={"X-Test-Mode": "hang",
                                             "X-Context-Hash": "abcdef0123456789"},
                                    timeout=aiohttp.ClientTimeout(total=0.5)):
                pass
    await _poll(lambda: sum(u.stats()["cancelled"] for u in fleet.upstreams) == 1)
    assert sum(u.stats()["in_flight"] for u in fleet.upstreams) == 0
    # counted, as a request its client closed (nginx's 499), on no worker
    async with aiohttp.ClientSession() as session, session.get(fleet.url + "/metrics") as m:
        lines = [line for line in (await m.text()).splitlines()
                 if line.startswith("prefix_router_requests_total{")]
    assert lines == ['prefix_router_requests_total{route="/v1/chat/completions",status="499",'
                     'worker="none"} 1.0']


async def test_a_client_leaving_at_done_still_counts_the_usage_it_was_sent(
        fleet: Fleet) -> None:
    """A client that closes at [DONE] while the engine has not yet ended its stream
    cancels the router's handler; what the engine reported in usage was still relayed and
    must still be learnt from, and the request counted (found: the bench's router counters
    missed one answer's cached tokens in a few runs out of ten)."""
    headers = {"X-Test-Mode": "linger-stream", "X-Test-Events": "2"}
    async with aiohttp.ClientSession() as session:
        async with session.post(fleet.url + "/v1/chat/completions",
                                json={**CHAT, "stream": True}, headers=headers) as resp:
            assert resp.status == 200
            served = resp.headers["X-Prefix-Router-Worker"]
            while not (line := await resp.content.readline()).startswith(b"data: [DONE]"):
                assert line, "the stream ended before [DONE]"
            resp.close()  # gone while the upstream still holds its stream open

        async def counted(prefix: str) -> float:
            async with session.get(fleet.url + "/metrics") as m:
                text = await m.text()
            return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                       if line.startswith(prefix))

        deadline = time.monotonic() + 10
        while (seen := await counted("prefix_router_cached_tokens_actual_total")) != 48:
            assert seen == 0 and time.monotonic() < deadline, seen
            await asyncio.sleep(0.05)
        # ...and the request is counted, as the 200 the client got from the worker
        assert await counted("prefix_router_requests_total{") == 1
        assert await counted('prefix_router_requests_total{route="/v1/chat/completions",'
                             f'status="200",worker="{served}"}}') == 1
    await _poll(lambda: sum(u.stats()["in_flight"] for u in fleet.upstreams) == 0)


@pytest.mark.router_args("--health-interval-s", "60", "--stream-resumes", "0")
async def test_killing_a_worker_loses_no_request_and_ends_its_streams_with_an_error(
        fleet: Fleet) -> None:
    victim = fleet.upstreams[1]
    async with aiohttp.ClientSession() as session:
        # open a long stream on every worker
        streams: dict[str, aiohttp.ClientResponse] = {}
        for i in range(200):
            if len(streams) == len(fleet.upstreams):
                break
            resp = await session.post(
                fleet.url + "/v1/chat/completions", json={**CHAT, "stream": True},
                headers={"X-Test-Mode": "slow-stream", "X-Test-Events": "100",
                         "X-Context-Hash": f"{i:016x}"})
            worker = resp.headers["X-Prefix-Router-Worker"]
            if worker in streams:
                resp.close()
            else:
                streams[worker] = resp
        assert len(streams) == len(fleet.upstreams)

        async def plain(i: int) -> int:
            async with session.post(fleet.url + "/v1/chat/completions", json=CHAT,
                                    headers={"X-Test-Mode": "sleep-20",
                                             "X-Context-Hash": f"{i + 1000:016x}"}) as r:
                await r.read()
                return r.status

        load = [asyncio.create_task(plain(i)) for i in range(60)]
        await asyncio.sleep(0.1)
        victim.proc.send_signal(signal.SIGKILL)
        load += [asyncio.create_task(plain(i)) for i in range(60, 120)]
        statuses = await asyncio.gather(*load)
        assert statuses == [200] * len(statuses)

        cut = await streams[victim.name].content.read()
        assert b'data: {"error"' in cut and cut.endswith(b"data: [DONE]\n\n")
        for name, resp in streams.items():
            if name != victim.name:
                whole = await resp.content.read()
                assert whole.endswith(event(99) + b"data: [DONE]\n\n")
                assert b'"error"' not in whole


@pytest.mark.router_args("--stream-resumes", "0")
async def test_stream_cut_after_first_byte_ends_with_error_event(fleet: Fleet) -> None:
    async with aiohttp.ClientSession() as session, session.post(
            fleet.url + "/v1/chat/completions", json={**CHAT, "stream": True},
            headers={"X-Test-Mode": "cut-stream"}) as resp:
        data = await resp.content.read()
    assert data.startswith(event(0) + event(1))
    assert b'data: {"error"' in data


async def test_5xx_before_first_byte_is_retried_on_the_next_worker(fleet: Fleet) -> None:
    async with aiohttp.ClientSession() as session, session.post(
            fleet.url + "/v1/chat/completions", json=CHAT,
            headers={"X-Test-Mode": "status-500"}) as resp:
        body = await resp.json()
    assert resp.status == 502
    assert body["error"]["code"] == "upstream_5xx"
    # default --retry-attempts 3: each of the three workers was tried once
    assert [u.stats()["requests"] for u in fleet.upstreams] == [1, 1, 1]


async def test_client_errors_from_a_worker_pass_through_unretried(fleet: Fleet) -> None:
    async with aiohttp.ClientSession() as session, session.post(
            fleet.url + "/v1/chat/completions", json=CHAT,
            headers={"X-Test-Mode": "status-422"}) as resp:
        body = await resp.json()
    assert resp.status == 422 and "says 422" in body["error"]["message"]
    assert sum(u.stats()["requests"] for u in fleet.upstreams) == 1


async def test_logs_are_json_lines_carrying_the_request_id(fleet: Fleet) -> None:
    async with aiohttp.ClientSession() as session, session.post(
            fleet.url + "/v1/chat/completions", json=CHAT,
            headers={"X-Test-Mode": "status-500", "X-Request-Id": "rid-log"}) as resp:
        assert resp.status == 502
    stop(fleet.router)
    assert fleet.router.stdout is not None
    entries = [json.loads(line) for line in fleet.router.stdout.read().splitlines() if line]
    failures = [e for e in entries if e.get("request_id") == "rid-log"]
    assert len(failures) == 3 and all(e["level"] == "warning" for e in failures)
    assert {e["worker"] for e in failures} == {"w0", "w1", "w2"}
