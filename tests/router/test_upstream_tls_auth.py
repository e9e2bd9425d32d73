"""Upstream TLS and upstream auth, against real parts on 127.0.0.1.

Workers are simulated vLLM servers (``python -m engine_worker.sim``) serving HTTPS with a
certificate from a private CA (made with openssl, tests/tls.py) and demanding an API key
as vLLM's ``--api-key`` does (401 ``{"error": "Unauthorized"}`` on guarded routes,
/health and /metrics open). Where the exact header a worker received matters, the
scripted upstream (tests/upstream_server.py) records it. The registry case uses a real
redis-server.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from subprocess import Popen

import pytest
from aiohttp.test_utils import TestClient, TestServer

from router.config import ConfigError, RouterConfig
from router.fleet.upstream_keys import KeyFileError, UpstreamKeys
from router.protocol import registry
from router.protocol.registry import key_fingerprint
from router.server.app import build_app
from router.server.state import ROUTER
from router.server.upstream import load_upstream
from tests.router.conftest import Upstream, start_upstreams
from tests.support import free_port, spawn, stop
from tests.tls import Certs, make_certs

MODEL = "sim-tls"
KEY = "sk-worker-3f9c1e7a"  # what the worker demands
CLIENT_KEY = "sk-client-77aa"  # what the client sends the router


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("tls"))


@dataclass
class Sim:
    port: int
    proc: Popen

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"


def wait_https(url: str, ca: Path, proc: Popen, timeout: float = 30.0) -> None:
    context = ssl.create_default_context(cafile=str(ca))
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"sim exited: {proc.stdout.read() if proc.stdout else ''}")
        try:
            with urllib.request.urlopen(url, timeout=1, context=context):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def start_sim(certs: Certs, *extra: str) -> Sim:
    port = free_port()
    proc = spawn(["-m", "engine_worker.sim", "--port", str(port), "--model", MODEL,
                  "--profile", "tiny@l4", "--time-scale", "0.001",
                  "--ssl-certfile", str(certs.cert), "--ssl-keyfile", str(certs.key),
                  "--api-key", KEY, *extra])
    sim = Sim(port, proc)
    try:
        wait_https(sim.url + "/health", certs.ca, proc)
    except BaseException:
        stop(proc)
        raise
    return sim


@pytest.fixture
def sim(certs: Certs) -> Iterator[Sim]:
    worker = start_sim(certs)
    yield worker
    stop(worker.proc)


@pytest.fixture
def keys_file(tmp_path: Path) -> Path:
    path = tmp_path / "upstream-keys"
    path.write_text(f"# keys the router presents\ntls {KEY}\n")
    return path


async def router(config: RouterConfig) -> TestClient:
    client = TestClient(TestServer(build_app(config)))
    await client.start_server()
    return client


@pytest.fixture
async def closing() -> AsyncIterator[list[TestClient]]:
    clients: list[TestClient] = []
    yield clients
    for client in clients:
        await client.close()


async def eventually(check, within_s: float = 20.0) -> None:
    deadline = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


def completion(prompt: str = "hello there") -> dict:
    return {"model": MODEL, "prompt": prompt, "max_tokens": 2}


async def test_https_worker_verified_by_the_ca_and_given_its_key(
        sim: Sim, certs: Certs, keys_file: Path, closing: list[TestClient],
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    client = await router(RouterConfig(
        workers=(("tls", sim.url),), upstream_ca_file=str(certs.ca),
        upstream_api_keys_file=str(keys_file), health_interval_s=0.2, scrape_interval_s=0.2))
    closing.append(client)
    worker = client.server.app[ROUTER].pool.get("tls")
    assert worker is not None
    # /v1/models is guarded by the key: the model list is learnt only with it, over TLS
    await eventually(lambda: worker.healthy and worker.models == {MODEL})
    await eventually(lambda: worker.capacity_blocks > 0)  # /metrics scraped over TLS
    resp = await client.post("/v1/completions", json=completion(),
                             headers={"Authorization": f"Bearer {CLIENT_KEY}"})
    assert resp.status == 200, await resp.text()  # the client's key would have got a 401
    assert (await resp.json())["object"] == "text_completion"
    stream = await client.post("/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
        "stream": True})
    assert stream.status == 200 and (await stream.read()).rstrip().endswith(b"[DONE]")
    described = await (await client.get("/health")).text()
    assert KEY not in described and KEY not in repr(worker)
    assert KEY not in caplog.text


async def test_https_worker_without_its_ca_is_down_and_requests_get_a_clean_503(
        sim: Sim, keys_file: Path, closing: list[TestClient],
        caplog: pytest.LogCaptureFixture) -> None:
    client = await router(RouterConfig(workers=(("tls", sim.url),),
                                       upstream_api_keys_file=str(keys_file),
                                       health_interval_s=0.2))
    closing.append(client)
    worker = client.server.app[ROUTER].pool.get("tls")
    assert worker is not None and not worker.healthy  # the system store does not trust it
    assert "TLS failed" in caplog.text and "CERTIFICATE_VERIFY_FAILED" in caplog.text
    resp = await client.post("/v1/completions", json=completion())
    assert resp.status == 503
    error = (await resp.json())["error"]
    assert set(error) >= {"message", "type", "code"}
    assert resp.headers.get("Retry-After")


async def test_without_a_key_of_its_own_the_clients_authorization_goes_through(
        sim: Sim, certs: Certs, closing: list[TestClient]) -> None:
    client = await router(RouterConfig(workers=(("tls", sim.url),),
                                       upstream_ca_file=str(certs.ca), health_interval_s=0.2))
    closing.append(client)
    worker = client.server.app[ROUTER].pool.get("tls")
    assert worker is not None and worker.healthy and worker.api_key is None
    right = await client.post("/v1/completions", json=completion(),
                              headers={"Authorization": f"Bearer {KEY}"})
    assert right.status == 200, await right.text()
    wrong = await client.post("/v1/completions", json=completion(),
                              headers={"Authorization": f"Bearer {CLIENT_KEY}"})
    assert wrong.status == 401  # the worker's refusal, relayed: not retried, not a 5xx
    error = (await wrong.json())["error"]  # vLLM's {"error": "Unauthorized"}, in OpenAI's shape
    assert error["type"] == "authentication_error" and "Unauthorized" in error["message"]


@pytest.fixture
def scripted() -> Iterator[list[Upstream]]:
    ups = start_upstreams(2)
    yield ups
    for up in ups:
        stop(up.proc)


async def test_the_header_each_worker_receives(scripted: list[Upstream], tmp_path: Path,
                                               closing: list[TestClient]) -> None:
    """w0 has a key: it gets exactly 'Bearer K0'; w1 has none: the client's header as sent.
    Health probes and scrapes of w0 carry its key too."""
    keys = tmp_path / "keys"
    keys.write_text(f"w0 K0\n{scripted[1].url}/unused-path-never-matches K1\n")
    client = await router(RouterConfig(
        workers=tuple((u.name, u.url) for u in scripted), upstream_api_keys_file=str(keys),
        health_interval_s=0.2, scrape_interval_s=0.2))
    closing.append(client)
    probes = ("/health", "/v1/models", "/metrics")
    await eventually(lambda: all(set(u.stats()["probe_auth"]) >= set(probes)
                                 for u in scripted))
    assert [scripted[0].stats()["probe_auth"][p] for p in probes] == ["Bearer K0"] * 3
    assert [scripted[1].stats()["probe_auth"][p] for p in probes] == [None] * 3
    seen: set[str] = set()
    for i in range(40):
        resp = await client.post("/v1/chat/completions", json={
            "model": "test-model", "messages": [{"role": "user", "content": f"q{i}"}]},
            headers={"Authorization": "Bearer client-token"})
        assert resp.status == 200
        name = resp.headers["X-Prefix-Router-Worker"]
        got = next(u for u in scripted if u.name == name).stats()["headers"]
        assert got.get("Authorization") == ("Bearer K0" if name == "w0" else
                                            "Bearer client-token")
        seen.add(name)
        if seen == {"w0", "w1"}:
            break
    assert seen == {"w0", "w1"}, "both workers should have served within 40 prompts"


async def test_a_registry_worker_names_its_key_by_fingerprint(
        certs: Certs, tmp_path: Path, redis_server, closing: list[TestClient]) -> None:
    sim = start_sim(certs, "--register-redis", redis_server.url, "--worker-id", "reg")
    try:
        keys = tmp_path / "keys"
        keys.write_text(f"another-key-entirely\n{KEY}\n")  # bare keys: found by fingerprint
        client = await router(RouterConfig(
            redis_url=redis_server.url, discover=True, registry_poll_s=0.2,
            upstream_ca_file=str(certs.ca), upstream_api_keys_file=str(keys),
            health_interval_s=0.2))
        closing.append(client)
        pool = client.server.app[ROUTER].pool
        await eventually(lambda: (w := pool.get("reg")) is not None and w.healthy
                         and w.models == {MODEL})
        worker = pool.get("reg")
        assert worker is not None and worker.url == sim.url  # advertised as https
        assert worker.key_fingerprint == key_fingerprint(KEY)
        resp = await client.post("/v1/completions", json=completion())  # no client header
        assert resp.status == 200, await resp.text()
        raw = redis_server.client().hgetall(registry.worker_key(registry.DEFAULT_KEY_PREFIX,
                                                                "reg"))
        assert raw and all(KEY.encode() not in v for v in raw.values()), \
            "the registry carries a fingerprint, never the key"
    finally:
        stop(sim.proc)


async def test_a_registry_worker_that_rotates_its_key_gets_the_new_one(
        tmp_path: Path, redis_server, closing: list[TestClient]) -> None:
    """Same id, same address, a new key: the record's new fingerprint makes the router
    present the new key to the worker it already has (it does not leave the pool)."""
    from router.server.discovery import Discovery

    new_key = "sk-rotated-5d1b"
    keys = tmp_path / "keys"
    keys.write_text(f"{KEY}\n{new_key}\n")
    client = await router(RouterConfig(
        redis_url=redis_server.url, discover=True, registry_poll_s=3600,
        upstream_api_keys_file=str(keys), health_interval_s=3600))
    closing.append(client)
    state = client.server.app[ROUTER]
    assert state.redis is not None
    discovery = Discovery(state, state.redis)

    async def register(key: str) -> None:
        await registry.publish(state.redis, registry.WorkerRecord(
            id="rot", url="https://127.0.0.1:9", models=(MODEL,),
            extra={registry.API_KEY_FINGERPRINT: key_fingerprint(key)}), ttl_s=60)
        await discovery.poll()

    await register(KEY)
    worker = state.pool.get("rot")
    assert worker is not None and worker.api_key == KEY
    await register(new_key)
    assert state.pool.get("rot") is worker and worker.api_key == new_key
    assert worker.auth_headers() == {"Authorization": f"Bearer {new_key}"}


def test_key_file_precedence_and_errors(tmp_path: Path) -> None:
    keys = UpstreamKeys.build(["# comment", "", "w0 k-w0", "http://h:1/ k-url", "* k-default",
                               "k-bare"])
    assert keys.for_worker("w0", "http://h:1") == "k-w0"
    assert keys.for_worker("w9", "http://h:1") == "k-url"
    assert keys.for_worker("w9", "http://other") == "k-default"
    assert keys.for_worker("w0", "http://h:1", key_fingerprint("k-bare")) == "k-bare"
    assert keys.for_worker("w9", "http://x", "0" * 16) == "k-default"  # unknown fingerprint
    assert UpstreamKeys.build(["w0 k"]).for_worker("w1", "http://x") is None
    assert UpstreamKeys.build([], "env-key").for_worker("w1", "http://x") == "env-key"
    assert "k-w0" not in repr(keys)
    with pytest.raises(KeyFileError) as bad:
        UpstreamKeys.build(["w0 secret-one extra"])
    assert "secret" not in str(bad.value)
    with pytest.raises(KeyFileError):
        UpstreamKeys.build(["w0 a", "w0 b"])


def test_unreadable_ca_or_key_file_fails_the_start(tmp_path: Path, certs: Certs) -> None:
    with pytest.raises(ConfigError, match="upstream_ca_file"):
        load_upstream(RouterConfig(upstream_ca_file=str(tmp_path / "missing.pem")))
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello")
    with pytest.raises(ConfigError, match="upstream_ca_file"):
        load_upstream(RouterConfig(upstream_ca_file=str(not_pem)))
    with pytest.raises(ConfigError, match="upstream_api_keys_file"):
        load_upstream(RouterConfig(upstream_api_keys_file=str(tmp_path / "missing")))
    assert load_upstream(RouterConfig(upstream_ca_file=str(certs.ca))).ssl is not None
    assert "sk-" not in repr(RouterConfig(upstream_api_key="sk-secret", admin_token="sk-x"))
