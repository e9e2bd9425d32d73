"""Requests through a real Envoy whose endpoint picker is prefix-router (ext_proc)."""

from __future__ import annotations

import json
import os
import random
import signal
import urllib.error
import urllib.request

import pytest

from tests.epp.conftest import MODEL, Gateway, start_gateway

WORDS = ("kernel", "cache", "block", "prefix", "router", "worker", "engine", "token", "vector",
         "retrieval")


def prompt(seed: int, words: int = 400) -> str:
    """A context of its own: distinct seeds share no prefix."""
    rng = random.Random(seed)
    return f"doc {seed}: " + " ".join(rng.choice(WORDS) for _ in range(words))


def post(url: str, body: dict, timeout: float = 30) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()


def complete(url: str, text: str, **extra: object) -> tuple[int, dict[str, str], bytes]:
    return post(url, {"model": MODEL, "prompt": text, "max_tokens": 4, **extra})


def test_requests_land_on_the_worker_the_picker_chose(shared_gateway: Gateway) -> None:
    gw = shared_gateway
    before = gw.served()
    chosen: dict[str, int] = {}
    for seed in range(8):
        status, headers, _ = complete(gw.url, prompt(100 + seed))
        assert status == 200
        worker = headers["x-prefix-router-worker"]  # the picker's answer, echoed by Envoy
        chosen[worker] = chosen.get(worker, 0) + 1
    after = gw.served()
    landed = {name: after[name] - before[name] for name in after}
    assert landed == {name: float(chosen.get(name, 0)) for name in after}
    assert len(chosen) >= 2  # the ring spreads distinct contexts


def test_stream_passes_every_event(shared_gateway: Gateway) -> None:
    status, headers, body = post(shared_gateway.url, {
        "model": MODEL, "prompt": prompt(7), "max_tokens": 12, "stream": True,
        "stream_options": {"include_usage": True}})
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = [e[len("data: "):] for e in body.decode().split("\n\n") if e]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    tokens = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"] is None]
    assert len(tokens) == 12
    assert chunks[-1]["usage"]["completion_tokens"] == 12


def test_same_context_goes_to_the_same_warm_worker(shared_gateway: Gateway) -> None:
    gw = shared_gateway
    text = prompt(42, words=1200)
    workers, cached = set(), []
    for _ in range(4):
        status, headers, body = complete(gw.url, text)
        assert status == 200
        workers.add(headers["x-prefix-router-worker"])
        cached.append(json.loads(body)["usage"]["prompt_tokens_details"]["cached_tokens"])
    assert len(workers) == 1
    assert cached[0] == 0 and all(c > 0 for c in cached[1:])  # the engine's own cache hits
    # the picker read the usage off the response bodies, as the proxy does
    assert gw.picker_metric("prefix_router_cached_tokens_actual_total") >= sum(cached)


def test_picker_metrics_count_decisions(shared_gateway: Gateway) -> None:
    gw = shared_gateway
    before = gw.picker_metric("prefix_router_routing_decisions_total")
    for seed in range(3):
        assert complete(gw.url, prompt(300 + seed))[0] == 200
    assert gw.picker_metric("prefix_router_routing_decisions_total") == before + 3
    served = gw.picker_metric("prefix_router_requests_total", status="200")
    assert served == sum(gw.served().values())  # every answer the engines gave was counted


def test_bad_request_is_refused_by_the_picker_with_its_status(shared_gateway: Gateway) -> None:
    before = sum(shared_gateway.served().values())
    status, _, body = post(shared_gateway.url, {"model": "no-such-model", "prompt": "x"})
    assert status == 404 and json.loads(body)["error"]["code"] == "model_not_found"
    status, _, body = post(shared_gateway.url, {"model": MODEL, "prompt": "x", "stream": "yes"})
    assert status == 400 and json.loads(body)["error"]["code"] == "invalid_stream"
    assert sum(shared_gateway.served().values()) == before  # no worker saw them


def test_dead_primary_is_retried_on_the_fallback(tmp_path) -> None:
    # health checks too slow to notice: the picker still ranks the dead worker first
    gw = start_gateway(tmp_path, picker_args=("--health-interval-s", "300"))
    try:
        text = prompt(9, words=800)
        status, headers, _ = complete(gw.url, text)
        assert status == 200
        home = gw.sim(headers["x-prefix-router-worker"])
        os.killpg(home.proc.popen.pid, signal.SIGKILL)
        home.proc.popen.wait()
        others = {s.name: s.counter("vllm:request_success_total")
                  for s in gw.sims if s is not home}
        status, headers, _ = complete(gw.url, text)
        assert status == 200
        fallback = headers["x-prefix-router-worker"]
        assert fallback != home.name and headers["x-prefix-router-reason"] == "failover"
        assert gw.sim(fallback).counter("vllm:request_success_total") == others[fallback] + 1
        assert gw.picker_metric("prefix_router_retries_total", cause="gateway_failover") == 1
        assert gw.picker_metric("prefix_router_worker_in_flight", worker=home.name) == 0
    finally:
        gw.stop()


@pytest.fixture
def picker_down(tmp_path) -> Gateway:
    gw = start_gateway(tmp_path, workers=2, fail_modes=("closed", "open"))
    yield gw
    gw.stop()


def test_picker_down_fails_closed_or_open_as_configured(picker_down: Gateway) -> None:
    gw = picker_down
    for envoy in gw.envoys.values():  # both work while the picker is up
        assert complete(envoy.url, prompt(5))[0] == 200
    gw.picker.stop()
    status, _, _ = complete(gw.envoys["closed"].url, prompt(5))
    assert status == 503
    before = sum(gw.served().values())
    status, headers, _ = complete(gw.envoys["open"].url, prompt(5))
    assert status == 200 and "x-prefix-router-worker" not in headers  # Envoy placed it
    assert sum(gw.served().values()) == before + 1


def test_lean_mode_still_ends_each_request_and_keeps_contexts_warm(tmp_path) -> None:
    """Response bodies bypass the picker (response_body_mode NONE): Envoy closing the
    ext_proc stream is the end of the request, the response headers its first byte."""
    gw = start_gateway(tmp_path, workers=2, response_body="NONE")
    try:
        text = prompt(11, words=1200)
        workers, reasons = set(), []
        for _ in range(3):
            status, headers, body = post(gw.url, {"model": MODEL, "prompt": text,
                                                  "max_tokens": 6, "stream": True})
            assert status == 200 and body.endswith(b"data: [DONE]\n\n")
            workers.add(headers["x-prefix-router-worker"])
            reasons.append(headers["x-prefix-router-reason"])
        assert len(workers) == 1 and reasons[1:] == ["warm", "warm"]
        worker = workers.pop()
        assert gw.picker_metric("prefix_router_worker_in_flight", worker=worker) == 0
        assert gw.picker_metric("prefix_router_requests_total", worker=worker,
                                status="200") == 3
        assert gw.picker_metric("prefix_router_cached_tokens_actual_total") == 0  # no usage
    finally:
        gw.stop()


def test_requests_without_a_keyed_body_go_to_the_least_loaded_worker(shared_gateway) -> None:
    gw = shared_gateway
    with urllib.request.urlopen(gw.url + "/v1/models", timeout=10) as resp:  # no body
        assert resp.status == 200 and resp.headers["x-prefix-router-reason"] == "least_loaded"
        assert MODEL in resp.read().decode()
    for _ in range(2):  # a body the picker does not key on, then a keyed one: no crosstalk
        req = urllib.request.Request(gw.url + "/tokenize", method="POST",
                                     data=json.dumps({"model": MODEL, "prompt": "hi"}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.headers["x-prefix-router-reason"] == "least_loaded"
    status, headers, _ = complete(gw.url, prompt(77))
    assert status == 200 and headers["x-prefix-router-reason"] != "least_loaded"
