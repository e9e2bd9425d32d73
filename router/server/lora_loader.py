"""Load a LoRA adapter on a worker when a request names one no worker has (opt-in).

Why opt-in and admin-configured: loading makes a worker fetch and hold weights, so only
adapters an operator listed (``--lora-adapters NAME=PATH``) are ever loaded, from the path
given there, never one a client names. The least-loaded routable worker takes it (through
vLLM's ``POST /v1/load_lora_adapter``, which needs VLLM_ALLOW_RUNTIME_LORA_UPDATING=1);
the router then knows it at once, before the next /v1/models poll confirms it. One load
per adapter at a time: concurrent requests for it wait for the same load.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp
from aiohttp import web

from router.fleet.workers import LoraAdapter, Worker, WorkerPool

log = logging.getLogger(__name__)


class LoraLoader:
    def __init__(self, sources: dict[str, str], pool: WorkerPool, timeout_s: float = 120.0
                 ) -> None:
        self.sources = sources
        self._pool = pool
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._loading: dict[str, asyncio.Lock] = {}

    async def ensure(self, model: str | None, session: aiohttp.ClientSession) -> None:
        """Load ``model`` somewhere when it is a configured adapter nobody serves; a
        failed load leaves the request to be refused as an unknown model."""
        if model is None or model not in self.sources or self._pool.knows_model(model):
            return
        lock = self._loading.setdefault(model, asyncio.Lock())
        async with lock:
            if self._pool.knows_model(model):
                return
            workers = sorted((w for w in self._pool if w.routable()), key=lambda w: w.load)
            if workers:
                await self._load(workers[0], model, session)

    async def _load(self, worker: Worker, name: str, session: aiohttp.ClientSession) -> None:
        path = self.sources[name]
        try:
            async with session.post(worker.url + "/v1/load_lora_adapter",
                                    json={"lora_name": name, "lora_path": path},
                                    headers=worker.auth_headers(),
                                    timeout=self._timeout) as resp:
                if resp.status != 200:
                    log.warning("worker %s refused to load LoRA %s: %s %s", worker.id, name,
                                resp.status, (await resp.text())[:300])
                    return
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("loading LoRA %s on worker %s failed: %r", name, worker.id, exc)
            return
        bases = [m for m in worker.models if m not in worker.adapters]
        parent = bases[0] if len(bases) == 1 else ""
        worker.set_serving(models=worker.models | {name},
                           adapters={**worker.adapters, name: LoraAdapter(name, parent, path)})
        log.info("loaded LoRA %s on worker %s", name, worker.id)


LORA_LOADER = web.AppKey("lora_loader", LoraLoader)
