"""InferencePool -> pool: in a cluster, the picker's workers are the pool's ready pods.

Every ``registry_poll_s`` the picker reads its ``InferencePool``
(inference.networking.k8s.io/v1: ``spec.selector.matchLabels``, ``spec.targetPorts``) and
the pods that selector matches, through the Kubernetes API with the pod's service-account
token; each ready pod (one worker per target port) joins as source "kube", and leaves when
it is no longer ready or selected. A failed read changes nothing: the pool keeps its last
known shape through an API-server blip, and health checks keep a dead pod out meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
from aiohttp import web

from router.infra.supervisor import SUPERVISOR
from router.server.state import ROUTER, RouterState

log = logging.getLogger(__name__)
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
POOL_API = "/apis/inference.networking.k8s.io/v1/namespaces/{ns}/inferencepools/{name}"
PODS_API = "/api/v1/namespaces/{ns}/pods"
SOURCE = "kube"


class KubeError(Exception):
    """The API server's answer could not be used (status, shape)."""


def pool_targets(pool: Mapping[str, Any]) -> tuple[dict[str, str], list[int]]:
    """The label selector and target ports of an InferencePool object."""
    spec = pool.get("spec") or {}
    selector = spec.get("selector") or {}
    labels = selector.get("matchLabels", selector)  # v1 wraps the labels; v1alpha2 did not
    ports = [int(p["number"]) for p in spec.get("targetPorts") or []]
    if not ports and "targetPortNumber" in spec:
        ports = [int(spec["targetPortNumber"])]
    if not labels or not ports:
        raise KubeError("InferencePool has no selector labels or target ports")
    return {str(k): str(v) for k, v in labels.items()}, ports


def ready_endpoints(pods: Mapping[str, Any], ports: list[int]) -> dict[str, str]:
    """Worker id -> URL for every ready, not terminating pod, one per target port."""
    out: dict[str, str] = {}
    for pod in pods.get("items") or []:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        ip = status.get("podIP")
        ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in status.get("conditions") or [])
        if not ip or not ready or meta.get("deletionTimestamp"):
            continue
        host = f"[{ip}]" if ":" in ip else ip
        for port in ports:
            worker_id = meta["name"] if len(ports) == 1 else f"{meta['name']}:{port}"
            out[worker_id] = f"http://{host}:{port}"
    return out


class InferencePoolDiscovery:
    def __init__(self, state: RouterState, session: aiohttp.ClientSession, api: str,
                 namespace: str, token_file: Path | None,
                 ssl_context: ssl.SSLContext | None) -> None:
        self._state = state
        self._session = session
        self._api = api.rstrip("/")
        self._namespace = namespace
        self._token_file = token_file  # re-read each poll: the kubelet rotates it
        self._ssl = ssl_context

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._state.config.registry_poll_s)
            await self.poll()

    async def poll(self) -> None:
        try:
            wanted = await self._read()
        except (aiohttp.ClientError, TimeoutError, KubeError, KeyError, ValueError) as exc:
            log.warning("InferencePool %s not read: %r", self._state.config.inference_pool, exc)
            return
        pool = self._state.pool
        for worker in pool:
            if worker.source == SOURCE and wanted.get(worker.id) != worker.url:
                pool.remove(worker.id)  # hooks: router/server/pool_hooks.py
                log.info("worker %s left the InferencePool", worker.id)
        for worker_id, url in wanted.items():
            existing = pool.get(worker_id)
            if existing is not None:
                continue  # already here (a static or admin worker of that id wins)
            worker = pool.add(self._state.new_worker(worker_id, url, SOURCE))
            log.info("worker %s joined from the InferencePool at %s", worker_id, url)
            if self._state.health is not None:
                await self._state.health.check(worker)

    async def _read(self) -> dict[str, str]:
        name = self._state.config.inference_pool
        pool = await self._get(POOL_API.format(ns=quote(self._namespace), name=quote(name)))
        labels, ports = pool_targets(pool)
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        pods = await self._get(PODS_API.format(ns=quote(self._namespace)),
                               {"labelSelector": selector})
        return ready_endpoints(pods, ports)

    async def _get(self, path: str, params: dict[str, str] | None = None) -> dict[str, Any]:
        token = _read(self._token_file) if self._token_file is not None else None
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with self._session.get(self._api + path, params=params, headers=headers,
                                     ssl=self._ssl if self._ssl is not None else True,
                                     timeout=aiohttp.ClientTimeout(total=5)) as resp:
            if resp.status != 200:
                raise KubeError(f"GET {path}: HTTP {resp.status}")
            body = await resp.json(content_type=None)
        if not isinstance(body, dict):
            raise KubeError(f"GET {path}: not an object")
        return body


def _in_cluster_api() -> str:
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get(
        "KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise KubeError("inference_pool is set but neither kube_api_url nor "
                        "KUBERNETES_SERVICE_HOST is")
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def _read(path: Path) -> str | None:
    return path.read_text().strip() if path.is_file() else None


async def inference_pool_ctx(app: web.Application) -> AsyncIterator[None]:
    """Follow ``inference_pool`` when set (epp mode only)."""
    state = app[ROUTER]
    config = state.config
    if not config.inference_pool:
        yield
        return
    assert state.session is not None
    ca = SERVICE_ACCOUNT / "ca.crt"
    discovery = InferencePoolDiscovery(
        state, state.session, config.kube_api_url or _in_cluster_api(),
        config.kube_namespace or _read(SERVICE_ACCOUNT / "namespace") or "default",
        SERVICE_ACCOUNT / "token",
        ssl.create_default_context(cafile=str(ca)) if ca.is_file() else None)
    await discovery.poll()  # start with the pods we can see
    app[SUPERVISOR].start("inference-pool", discovery.run)
    yield
    await app[SUPERVISOR].stop("inference-pool")
