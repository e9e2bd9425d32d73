"""Workers from an InferencePool: the picker reads the pool and its pods from a real HTTP
server standing in for the Kubernetes API (fixture objects), and follows them."""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from bench import fleet, gateway
from tests.epp.conftest import MODEL

NAMESPACE, POOL, TOKEN = "llm", "rag-pool", "kube-test"
POOL_PATH = f"/apis/inference.networking.k8s.io/v1/namespaces/{NAMESPACE}/inferencepools/{POOL}"
PODS_PATH = f"/api/v1/namespaces/{NAMESPACE}/pods"


def shared_port(*hosts: str) -> int:
    """A port free on every one of these loopback addresses (pods share their port)."""
    while True:
        with socket.socket() as first:
            first.bind((hosts[0], 0))
            port = first.getsockname()[1]
            try:
                for host in hosts[1:]:
                    with socket.socket() as other:
                        other.bind((host, port))
            except OSError:
                continue
            return port


class FakeKubeApi:
    """The two reads the picker makes; the test edits ``pods`` and ``failing``."""

    def __init__(self, port: int) -> None:
        self.pods: dict[str, tuple[str, bool]] = {}  # name -> (pod IP, ready)
        self.port = port
        self.failing = False
        self.selectors: list[str] = []

    async def pool(self, _request: web.Request) -> web.Response:
        if self.failing:
            return web.json_response({"kind": "Status", "code": 500}, status=500)
        return web.json_response({
            "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
            "metadata": {"name": POOL, "namespace": NAMESPACE},
            "spec": {"selector": {"matchLabels": {"app": "sim", "tier": "engine"}},
                     "targetPorts": [{"number": self.port}],
                     "endpointPickerRef": {"name": "epp", "port": {"number": 9002}}}})

    async def list_pods(self, request: web.Request) -> web.Response:
        self.selectors.append(request.query.get("labelSelector", ""))
        items = [{"metadata": {"name": name, "labels": {"app": "sim", "tier": "engine"}},
                  "status": {"podIP": ip, "conditions": [
                      {"type": "Ready", "status": "True" if ready else "False"}]}}
                 for name, (ip, ready) in self.pods.items()]
        return web.json_response({"kind": "PodList", "items": items})


@pytest.fixture
async def kube_api() -> AsyncIterator[tuple[FakeKubeApi, str]]:
    api = FakeKubeApi(shared_port("127.0.0.2", "127.0.0.3"))
    app = web.Application()
    app.router.add_get(POOL_PATH, api.pool)
    app.router.add_get(PODS_PATH, api.list_pods)
    runner = web.AppRunner(app)
    await runner.setup()
    port = fleet.free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield api, f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def workers(session: aiohttp.ClientSession, picker: fleet.Proc) -> dict[str, dict]:
    async with session.get(picker.url + "/admin/workers",
                           headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
        return {w["id"]: w for w in (await resp.json())["workers"]}


async def until(check, session, picker) -> dict[str, dict]:
    """Poll the picker's pool until ``check`` holds (20 s: a hundred polls)."""
    async with asyncio.timeout(20):
        while True:
            seen = await workers(session, picker)
            if check(seen):
                return seen
            await asyncio.sleep(0.1)


async def test_picker_follows_the_pools_ready_pods(kube_api, tmp_path) -> None:
    api, api_url = kube_api
    sims = [fleet.spawn(f"pod-{x}", [sys.executable, "-m", "engine_worker.sim", "--host", ip,
                                     "--port", str(api.port), "--model", MODEL,
                                     "--time-scale", "0.001", "--log-level", "WARNING"],
                        f"http://{ip}:{api.port}", tmp_path)
            for x, ip in (("a", "127.0.0.2"), ("b", "127.0.0.3"))]
    picker = None
    try:
        for sim in sims:
            await asyncio.to_thread(fleet.ready, sim)
        api.pods = {"pod-a": ("127.0.0.2", True), "pod-b": ("127.0.0.3", False)}
        picker, _ = await asyncio.to_thread(
            gateway.start_picker, [], "predicted_ttft", tmp_path,
            extra=["--inference-pool", POOL, "--kube-api-url", api_url, "--kube-namespace",
                   NAMESPACE, "--registry-poll-s", "0.2", "--health-interval-s", "0.2",
                   "--admin-token", TOKEN])
        async with aiohttp.ClientSession() as session:
            seen = await workers(session, picker)  # read before the first pick: /ready was up
            assert set(seen) == {"pod-a"}
            assert seen["pod-a"]["url"] == f"http://127.0.0.2:{api.port}"
            assert seen["pod-a"]["source"] == "kube" and seen["pod-a"]["healthy"]
            assert api.selectors[0] == "app=sim,tier=engine"

            api.pods["pod-b"] = ("127.0.0.3", True)  # became ready
            await until(lambda s: set(s) == {"pod-a", "pod-b"}, session, picker)

            del api.pods["pod-a"]  # scaled down
            await until(lambda s: set(s) == {"pod-b"}, session, picker)

            api.failing = True  # an API-server blip keeps the last known pool
            reads = len(api.selectors)
            await asyncio.sleep(1.0)
            assert set(await workers(session, picker)) == {"pod-b"}
            assert len(api.selectors) == reads  # the pool read failed; pods not listed
    finally:
        for proc in [picker, *sims]:
            if proc is not None:
                proc.stop()
