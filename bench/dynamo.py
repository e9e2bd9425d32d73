"""Dynamo's own KV router as a bench baseline: ``python -m bench run --policy dynamo_kv``.

Dynamo's KV router normally sits in Dynamo's own frontend, in front of workers registered
with its runtime. ai-dynamo 1.6.1 also ships the router's selection core for plain workers
(``dynamo.llm.SelectionService``, the core behind ``python -m dynamo.select_service``): it
subscribes to each worker's vLLM-format ZMQ KV events and picks a worker for a list of
token ids from KV overlap and its own load model. So that the comparison is of Dynamo's
decision and not of a harness, this module runs that core with its default settings in a
thin shim process that speaks OpenAI HTTP. Each worker is registered with what a vLLM
worker tells Dynamo: endpoint, KV-event endpoint, block size, KV blocks, batch tokens.

- tokenise the prompt with the simulator's own code (``engine_worker.sim``: the same ids,
  hence the same block hashes, as the engine computes);
- ``select_and_reserve`` -> forward the original bytes to that worker and stream back ->
  ``prefill_complete`` at the first streamed byte -> ``free_reservation`` at the end;
- answer with ``X-Prefix-Router-Worker: w<i>`` (index in the worker list) for the bench's
  per-worker analysis, and ``X-Prefix-Router-Reason`` (``match``/``load``/``cold``, see
  ``reason``) from the indexer's overlap scores, queried alongside the selection.

The shim runs under ``.venv-dynamo/bin/python`` (in process, so no extra HTTP hop per
request); the launcher half (``start_dynamo``) runs in the project's venv. Its
client-side TTFT includes the shim's Python tokenisation: compare engine TTFT as well.

Install (its own venv: a plain ``pip install ai-dynamo==1.6.1`` fails on an unfetchable
``aisimulate`` pin, and its pins must not meet the router's)::

    make dynamo-env

The workers bind their KV-event publishers on all interfaces (``tcp://*:PORT``, as vLLM
does), so run inside a loopback-only network namespace; ``start_dynamo`` refuses otherwise::

    unshare -n sh -c 'ip link set lo up; .venv/bin/python -m bench run --policy dynamo_kv ...'
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
from aiohttp import web

from engine_worker.sim import openai_api
from engine_worker.sim.profiles import load_profile
from engine_worker.sim.tokenizer import SimTokenizer

if TYPE_CHECKING:
    from bench.fleet import Proc, WorkerSpec

REPO = Path(__file__).resolve().parent.parent
DYNAMO_PYTHON = REPO / ".venv-dynamo" / "bin" / "python"
BLOCK_SIZE = 16
MAX_NUM_BATCHED_TOKENS = 8192  # the simulator's default, as vLLM would publish it to Dynamo
WORKER_HEADER = "X-Prefix-Router-Worker"
REASON_HEADER = "X-Prefix-Router-Reason"
INSTALL_HINT = "Dynamo is not installed: run `make dynamo-env` (builds .venv-dynamo)"
NETNS_HINT = ("dynamo_kv needs a loopback-only network namespace (the workers' KV-event "
              "publishers bind every interface): unshare -n sh -c 'ip link set lo up; ...'")


def available() -> bool:
    return DYNAMO_PYTHON.exists()


def loopback_only() -> bool:
    """True inside a network namespace whose only interface is lo (/sys may be the host's)."""
    return [name for _, name in socket.if_nameindex()] == ["lo"]


# -- launcher side (project venv) ------------------------------------------------------

def start_workers(n: int, spec: WorkerSpec, logdir: Path) -> tuple[list[Proc], list[str]]:
    """Like fleet.start_workers, plus one vLLM-format KV-event publisher port per worker.

    Returns the workers and the endpoints Dynamo subscribes to.
    """
    from bench import fleet  # project venv only: fleet imports the router package

    procs: list[Proc] = []
    endpoints: list[str] = []
    taken: set[int] = set()

    def port() -> int:
        while (p := fleet.free_port()) in taken:
            pass
        taken.add(p)
        return p

    try:
        for i in range(n):
            http, events = port(), port()
            argv = [sys.executable, "-m", "engine_worker.sim", "--host", "127.0.0.1",
                    "--port", str(http), "--model", fleet.MODEL, "--profile", spec.profile,
                    "--time-scale", str(spec.time_scale), "--seed", str(i),
                    "--max-num-seqs", str(spec.max_num_seqs), "--log-level", "WARNING",
                    "--block-size", str(BLOCK_SIZE),
                    "--kv-events-endpoint", f"tcp://*:{events}", "--kv-events-format", "map",
                    "--kv-events-int-hashes"]
            if spec.num_gpu_blocks:
                argv += ["--num-gpu-blocks", str(spec.num_gpu_blocks)]
            if spec.max_model_len:
                argv += ["--max-model-len", str(spec.max_model_len)]
            procs.append(fleet.spawn(f"worker{i}", argv + spec.extra,
                                     f"http://127.0.0.1:{http}", logdir))
            endpoints.append(f"tcp://127.0.0.1:{events}")
        for p in procs:  # started together, waited for together
            fleet.ready(p)
    except Exception:
        for p in procs:
            p.stop()
        raise
    return procs, endpoints


def start_dynamo(worker_count: int, spec: WorkerSpec,
                 logdir: Path) -> tuple[list[Proc], Proc]:
    """Start KV-event-publishing workers and the Dynamo shim in front of them."""
    from bench import fleet

    if not available():
        raise SystemExit(INSTALL_HINT)
    if not loopback_only():
        raise SystemExit(NETNS_HINT)
    workers, endpoints = start_workers(worker_count, spec, logdir)
    try:
        port = fleet.free_port()
        argv = [str(DYNAMO_PYTHON), "-m", "bench.dynamo", "--port", str(port),
                "--workers", ",".join(w.url for w in workers),
                "--kv-events", ",".join(endpoints), "--profile", spec.profile]
        if spec.num_gpu_blocks:
            argv += ["--total-kv-blocks", str(spec.num_gpu_blocks)]
        router = fleet.launch("dynamo", argv, f"http://127.0.0.1:{port}", logdir,
                              env={"DYN_LOG": "warn", "NO_COLOR": "1"}, timeout=90.0)
    except BaseException:
        for w in workers:
            w.stop()
        raise
    return workers, router


# -- shim side (.venv-dynamo) ------------------------------------------------------------

def reason(chosen: int, scores: dict[str, Any]) -> str:
    """Label a decision from the indexer's per-worker match, so the records can explain it.

    ``cold``: no worker holds a block of the prompt; ``match``: the chosen worker holds the
    longest cached prefix (ties included); ``load``: another worker held a longer one and
    Dynamo's load term outweighed it.
    """
    matched = {int(w["worker_id"]): int(w.get("device_blocks") or 0)
               for w in scores.get("workers", [])}
    best = max(matched.values(), default=0)
    if best == 0:
        return "cold"
    return "match" if matched.get(chosen, 0) >= best else "load"



class Shim:
    """OpenAI-compatible front that asks Dynamo's selection core where each request goes."""

    def __init__(self, worker_urls: Sequence[str], kv_events: Sequence[str], profile: str,
                 total_kv_blocks: int | None) -> None:
        self.urls = list(worker_urls)
        self.kv_events = list(kv_events)
        self.total_kv_blocks = total_kv_blocks
        self.tokenizer = SimTokenizer(load_profile(profile).model.vocab)
        self.ids = itertools.count()
        self.svc: Any = None
        self.session: aiohttp.ClientSession | None = None

    async def start(self, _app: web.Application) -> None:
        from dynamo.llm import SelectionService  # .venv-dynamo only

        self.svc = SelectionService()  # Dynamo's defaults
        for i, (url, events) in enumerate(zip(self.urls, self.kv_events, strict=True)):
            await self.svc.upsert_worker({
                "worker_id": i, "endpoint": url, "kv_events_endpoint": events,
                "block_size": BLOCK_SIZE, "total_kv_blocks": self.total_kv_blocks,
                "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS})
        await asyncio.sleep(1.0)  # ZMQ SUB joins late; events published before are lost
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_read=600))

    async def stop(self, _app: web.Application) -> None:
        if self.session is not None:
            await self.session.close()
        if self.svc is not None:
            self.svc.shutdown()

    async def health(self, _request: web.Request) -> web.Response:
        state = self.svc.ready() if self.svc is not None else {"schedulable_workers": 0}
        ok = state.get("schedulable_workers") == len(self.urls)
        return web.json_response(state, status=200 if ok else 503)

    def token_ids(self, body: bytes, chat: bool) -> list[int]:
        """The ids the simulated engine will compute for this body (its own parser)."""
        obj = orjson.loads(body)
        model = obj.get("model") if isinstance(obj, dict) else None
        params = openai_api.parse(obj, chat, model or "")
        return params.prompt_ids or self.tokenizer.encode(params.prompt_text or "")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        try:
            ids = self.token_ids(body, request.path.endswith("/chat/completions"))
        except openai_api.ApiError as err:  # what the engine would answer
            return web.json_response(err.body(), status=err.status)
        except (orjson.JSONDecodeError, AttributeError):
            return web.json_response(openai_api.ApiError(400, "invalid JSON body").body(),
                                     status=400)
        sid = f"{os.getpid()}-{next(self.ids)}"
        try:
            try:  # the overlap scores only label the decision: queried alongside, not after
                sel, scores = await asyncio.gather(
                    self.svc.select_and_reserve({"token_ids": ids, "selection_id": sid}),
                    self.svc.overlap_scores({"token_ids": ids}))
            except Exception as exc:  # noqa: BLE001 - no worker to send it to
                return web.json_response({"error": {"message": f"dynamo: {exc}"}}, status=503)
            index = int(sel["worker_id"])
            return await self._forward(request, body, sid, index, reason(index, scores))
        finally:
            with contextlib.suppress(Exception):
                await self.svc.free_reservation(sid)

    async def _forward(self, request: web.Request, body: bytes, sid: str, index: int,
                       why: str) -> web.StreamResponse:
        headers = {WORKER_HEADER: f"w{index}", REASON_HEADER: why}
        assert self.session is not None
        resp: web.StreamResponse | None = None
        try:
            async with self.session.post(self.urls[index] + request.path, data=body,
                                         headers={"Content-Type": "application/json"}) as up:
                headers["Content-Type"] = up.headers.get("Content-Type", "application/json")
                resp = web.StreamResponse(status=up.status, headers=headers)
                await resp.prepare(request)
                first = True
                async for chunk in up.content.iter_any():
                    if first:
                        first = False
                        await self.svc.prefill_complete(sid)
                    await resp.write(chunk)
                await resp.write_eof()
                return resp
        except aiohttp.ClientError as exc:
            if resp is not None:  # cut mid-stream: the client sees no [DONE]
                return resp
            return web.json_response({"error": {"message": f"worker w{index}: {exc}"}},
                                     status=502, headers=headers)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.on_startup.append(self.start)
        app.on_cleanup.append(self.stop)
        app.router.add_get("/health", self.health)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.completions)
        return app


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.dynamo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--workers", required=True, help="comma-separated worker base URLs")
    p.add_argument("--kv-events", required=True, help="comma-separated ZMQ endpoints, same order")
    p.add_argument("--profile", default="llama-3-8b@h100-80gb", help="for the vocabulary size")
    p.add_argument("--total-kv-blocks", type=int, default=None)
    args = p.parse_args(argv)
    shim = Shim(args.workers.split(","), args.kv_events.split(","), args.profile,
                args.total_kv_blocks)
    web.run_app(shim.app(), host="127.0.0.1", port=args.port, access_log=None,
                print=None, handle_signals=True)


if __name__ == "__main__":
    main()
