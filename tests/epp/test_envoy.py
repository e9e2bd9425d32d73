"""Requests through a real Envoy whose endpoint picker is prefix-router (ext_proc)."""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
import urllib.error
import urllib.request

import pytest

from tests.epp.conftest import MODEL, Gateway, start_gateway

OBSERVED = "prefix_router_epp_observations_total"
USAGE_READ = "prefix_router_cache_prediction_error_ratio_count"  # one per answer with usage

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


def stream_body(tokens: int, text: str) -> dict:
    return {"model": MODEL, "prompt": text, "max_tokens": tokens, "stream": True,
            "stream_options": {"include_usage": True}}


def events(body: bytes) -> tuple[list[dict], str]:
    """The stream's JSON chunks, and its last event."""
    found = [e[len("data: "):] for e in body.decode().split("\n\n") if e]
    return [json.loads(e) for e in found[:-1]], found[-1]


def token_chunks(chunks: list[dict]) -> list[dict]:
    return [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"] is None]


def test_requests_land_on_the_worker_the_picker_chose(shared_gateway: Gateway) -> None:
    gw = shared_gateway
    before = gw.served()
    chosen: dict[str, int] = {}
    for seed in range(8):
        status, headers, _ = complete(gw.url, prompt(100 + seed))
        assert status == 200
        worker = headers["x-prefix-router-worker"]  # the picker's answer, echoed by Envoy
        assert float(headers["x-prefix-router-predicted-ttft-ms"]) > 0  # as the proxy says
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
    chunks, last = events(body)
    assert last == "[DONE]"
    assert len(token_chunks(chunks)) == 12
    assert chunks[-1]["usage"]["completion_tokens"] == 12


def test_same_context_goes_to_the_same_warm_worker(shared_gateway: Gateway) -> None:
    gw = shared_gateway
    text = prompt(42, words=1200)
    gw.quiet()
    before = gw.picker_metric("prefix_router_cached_tokens_actual_total")
    workers, cached = set(), []
    for _ in range(4):
        status, headers, body = complete(gw.url, text)
        assert status == 200
        workers.add(headers["x-prefix-router-worker"])
        cached.append(json.loads(body)["usage"]["prompt_tokens_details"]["cached_tokens"])
    assert len(workers) == 1
    assert cached[0] == 0 and all(c > 0 for c in cached[1:])  # the engine's own cache hits
    # the picker read the usage off the (observed) response bodies, as the proxy does
    name = "prefix_router_cached_tokens_actual_total"
    assert gw.settled_metric(name, before + sum(cached)) == before + sum(cached)


def test_picker_metrics_count_decisions(shared_gateway: Gateway) -> None:
    gw = shared_gateway
    gw.quiet()
    before = gw.picker_metric("prefix_router_routing_decisions_total")
    for seed in range(3):
        assert complete(gw.url, prompt(300 + seed))[0] == 200
    assert gw.settled_metric("prefix_router_routing_decisions_total", before + 3) == before + 3
    engines = sum(gw.served().values())
    # every answer the engines gave was counted
    assert gw.settled_metric("prefix_router_requests_total", engines, status="200") == engines


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
        assert gw.settled_metric("prefix_router_worker_in_flight", 0, worker=home.name) == 0
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
    """Response bodies bypass the picker (no observer filter, response_body_mode NONE):
    Envoy closing the ext_proc stream is the end of the request, the response headers its
    first byte."""
    gw = start_gateway(tmp_path, workers=2, mode="lean")
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
        assert gw.settled_metric("prefix_router_worker_in_flight", 0, worker=worker) == 0
        assert gw.settled_metric("prefix_router_requests_total", 3, worker=worker,
                                 status="200") == 3
        assert gw.picker_metric("prefix_router_cached_tokens_actual_total") == 0  # no usage
    finally:
        gw.stop()


@pytest.mark.parametrize("mode", ["observed", "held"])
def test_a_long_stream_stays_in_flight_until_its_last_byte(tmp_path, mode: str) -> None:
    """The picker ends a request when its observed body ends or Envoy closes the picking
    stream. A stream outliving the observation grace (0.5 s here) stays in flight to its
    end and is ended by its observation, never expired (Envoy closed the picking stream
    right after the response headers when it streamed the request body with trailers
    skipped: a 12 s prefill counted as ended after 5 s, and its worker drew new requests)."""
    gw = start_gateway(tmp_path, workers=1, time_scale=1.0, mode=mode,
                       picker_args=("--epp-observe-grace-s", "0.5"))
    try:
        body = {"model": MODEL, "prompt": prompt(3, words=200), "max_tokens": 300,
                "stream": True}
        answers: list[tuple[int, dict[str, str], bytes]] = []
        stream = threading.Thread(target=lambda: answers.append(post(gw.url, body, 120)))
        started = time.monotonic()
        stream.start()
        running_samples = 0
        while stream.is_alive():
            in_flight = gw.picker_metric("prefix_router_worker_in_flight")
            expired = gw.picker_metric("prefix_router_epp_observations_total",
                                       outcome="expired")
            assert expired == 0, "a running stream was counted as ended"
            if time.monotonic() - started > 1.2 and stream.is_alive():
                assert in_flight == 1, "the worker lost a stream that was still running"
                running_samples += 1
            time.sleep(0.1)
        assert answers and answers[0][0] == 200 and answers[0][2].endswith(b"data: [DONE]\n\n")
        assert running_samples > 0, "the stream ended too soon to show anything"
        assert gw.settled_metric("prefix_router_epp_observations_total", 1,
                                 outcome="observed") == 1
        assert gw.settled_metric("prefix_router_worker_in_flight", 0) == 0
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


def test_response_bodies_reach_the_picker_off_the_data_path(shared_gateway: Gateway) -> None:
    """The shipped config: the observer filter sends every response chunk to the picker in
    observability mode; the picker never answers one, yet each response arrives whole and
    the picker learns from each answer's usage."""
    gw = shared_gateway
    gw.quiet()
    observed, usage_read = gw.picker_metric(OBSERVED, outcome="observed"), \
        gw.picker_metric(USAGE_READ)
    sent = gw.envoy_stat("http.inference.ext_proc.observer.stream_msgs_sent")
    for seed in range(4):
        status, _, body = post(gw.url, stream_body(20, prompt(500 + seed)))
        chunks, last = events(body)
        assert status == 200 and last == "[DONE]" and len(token_chunks(chunks)) == 20
    assert gw.settled_metric(OBSERVED, observed + 4, outcome="observed") == observed + 4
    assert gw.settled_metric(USAGE_READ, usage_read + 4) == usage_read + 4
    assert gw.envoy_stat("http.inference.ext_proc.observer.stream_msgs_sent") >= sent + 4
    # no reply ever reached Envoy on the observer's streams: it waited for none
    assert gw.envoy_stat("http.inference.ext_proc.observer.stream_msgs_received") == 0
    assert gw.picker_metric(OBSERVED, outcome="unmatched") == 0
    assert gw.picker_metric(OBSERVED, outcome="expired") == 0


def observer_filter(config: dict) -> dict:
    manager = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"]
    return next(f["typed_config"] for f in manager["http_filters"]
                if f["typed_config"].get("observability_mode"))


def long_observation(config: dict) -> None:
    """Envoy keeps a finished request's observer stream open for 120 s."""
    observer_filter(config)["deferred_close_timeout"] = "120s"


def test_envoy_does_not_wait_on_a_frozen_picker_for_response_chunks(tmp_path) -> None:
    """The picker is stopped (SIGSTOP) once the pick and the response headers are done:
    the stream still reaches the client whole, at the engine's pace, and the picker,
    thawed, reads the observation behind Envoy and still learns from it. With the body in
    line (each chunk waiting on the picker) the stream would stall and Envoy cut it at its
    5 s message timeout."""
    # ~7 ms a token: ~1.4 s frozen; a long grace on both sides however slow CI is
    gw = start_gateway(tmp_path, workers=1, time_scale=1.0,
                       picker_args=("--epp-observe-grace-s", "120"), edit=long_observation)
    try:
        usage_read = gw.picker_metric(USAGE_READ)
        req = urllib.request.Request(
            gw.url + "/v1/completions", data=json.dumps(stream_body(200, prompt(8))).encode(),
            headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, timeout=60) as resp:
            first = resp.readline()  # the first token's event: the picker has answered
            os.kill(gw.picker.popen.pid, signal.SIGSTOP)
            try:
                rest = resp.read()
            finally:
                os.kill(gw.picker.popen.pid, signal.SIGCONT)
        chunks, last = events(first + rest)
        assert last == "[DONE]" and len(token_chunks(chunks)) == 200
        assert gw.settled_metric(USAGE_READ, usage_read + 1) == usage_read + 1
        assert gw.settled_metric(OBSERVED, 1, outcome="observed") == 1
        assert gw.settled_metric("prefix_router_worker_in_flight", 0) == 0
        assert gw.envoy_stat("http.inference.ext_proc.picker.message_timeouts") == 0
    finally:
        gw.stop()


def dead_observer(config: dict) -> None:
    """Point the observer filter at a port nobody listens on: every observation is lost."""
    resources = config["static_resources"]
    observer_filter(config)["grpc_service"]["envoy_grpc"]["cluster_name"] = "nobody"
    resources["clusters"].append({"name": "nobody", "type": "STATIC", "connect_timeout": "1s",
                                  "typed_extension_protocol_options": resources["clusters"][0][
                                      "typed_extension_protocol_options"],
                                  "load_assignment": {"cluster_name": "nobody", "endpoints": [
                                      {"lb_endpoints": [{"endpoint": {"address": {
                                          "socket_address": {"address": "127.0.0.1",
                                                             "port_value": 9}}}}]}]}})


def test_lost_observations_still_end_each_request(tmp_path) -> None:
    """The observer's streams fail: requests are served all the same, the picker ends
    each one's accounting after its grace (no phantom load), keeps the context warm on
    the worker that served it, and has no usage to learn from."""
    gw = start_gateway(tmp_path, workers=2, picker_args=("--epp-observe-grace-s", "0.5"),
                       edit=dead_observer)
    try:
        text = prompt(13, words=1200)
        reasons, workers = [], set()
        for _ in range(3):
            status, headers, body = post(gw.url, stream_body(6, text))
            assert status == 200 and events(body)[1] == "[DONE]"
            workers.add(headers["x-prefix-router-worker"])
            reasons.append(headers["x-prefix-router-reason"])
            gw.quiet()  # the grace passes: the next pick sees the engine's cache
        assert len(workers) == 1 and reasons[1:] == ["warm", "warm"]
        assert gw.settled_metric(OBSERVED, 3, outcome="expired") == 3
        assert gw.picker_metric(OBSERVED, outcome="observed") == 0
        assert gw.picker_metric(USAGE_READ) == 0
        assert gw.settled_metric("prefix_router_requests_total", 3, status="200") == 3
        assert gw.envoy_stat("cluster.nobody.upstream_cx_connect_fail") >= 1  # Envoy tried
    finally:
        gw.stop()


def test_inline_bodies_as_gie_gateways_send_them_are_learned_from(tmp_path) -> None:
    """No observer filter, the picking filter streams the body (what a GIE gateway's
    Envoy sends): the picker reads usage in line and answers each chunk."""
    gw = start_gateway(tmp_path, workers=2, mode="inline")
    try:
        text = prompt(17, words=1200)
        cached = []
        for _ in range(3):
            status, _, body = post(gw.url, stream_body(6, text))
            chunks, last = events(body)
            assert status == 200 and last == "[DONE]"
            cached.append(chunks[-1]["usage"]["prompt_tokens_details"]["cached_tokens"])
        assert cached[0] == 0 and all(c > 0 for c in cached[1:])
        name = "prefix_router_cached_tokens_actual_total"
        assert gw.settled_metric(name, sum(cached)) == sum(cached)
        assert gw.settled_metric("prefix_router_worker_in_flight", 0) == 0
        assert gw.picker_metric(OBSERVED) == 0  # nothing came the observer's way
        # Envoy waited on a reply for every chunk
        assert gw.envoy_stat("http.inference.ext_proc.picker.stream_msgs_received") > 3 * 3
    finally:
        gw.stop()


def test_a_body_streamed_without_waiting_gets_the_pick_in_the_held_headers(tmp_path) -> None:
    """A gateway that streams the body without waiting for the answer to the headers: the
    picker holds that answer until the body is whole and puts the pick in it (Envoy routes
    on it), and a context still lands on its warm worker."""
    gw = start_gateway(tmp_path, workers=2, mode="held")
    try:
        text = prompt(19, words=1200)
        workers, cached = set(), []
        for _ in range(3):
            status, headers, body = post(gw.url, stream_body(6, text))
            chunks, last = events(body)
            assert status == 200 and last == "[DONE]"
            workers.add(headers["x-prefix-router-worker"])
            cached.append(chunks[-1]["usage"]["prompt_tokens_details"]["cached_tokens"])
        assert len(workers) == 1 and cached[0] == 0 and all(c > 0 for c in cached[1:])
        assert gw.sim(workers.pop()).counter("vllm:request_success_total") == 3
        assert gw.settled_metric("prefix_router_worker_in_flight", 0) == 0
    finally:
        gw.stop()
