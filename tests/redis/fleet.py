"""Real processes for the Redis acceptance tests: simulated workers and router replicas."""

from __future__ import annotations

import asyncio
import json
import random
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from tests.support import free_port, spawn, stop, wait_http

ADMIN_TOKEN = "redis-tests"
MODEL = "sim-model"
WORDS = ("alpha", "beta", "gamma", "delta", "kernel", "cache", "block", "prefix", "router",
         "worker", "engine", "token", "vector", "retrieval", "context", "answer", "paper")


@dataclass
class Proc:
    proc: subprocess.Popen
    url: str
    name: str


@dataclass
class Fleet:
    """Starts processes and stops every one of them at the end (SIGKILL as a last resort)."""

    procs: list[Proc] = field(default_factory=list)

    def sim(self, name: str, redis_url: str | None = None, *extra: str,
            time_scale: float = 0.001) -> Proc:
        port = free_port()
        args = ["-m", "engine_worker.sim", "--host", "127.0.0.1", "--port", str(port),
                "--model", MODEL, "--time-scale", str(time_scale), "--log-level", "WARNING",
                "--drain-timeout", "10", *extra]
        if redis_url:
            args += ["--register-redis", redis_url, "--worker-id", name]
        return self._start(args, f"http://127.0.0.1:{port}", name, "/health")

    def router(self, name: str, redis_url: str | None, workers: list[Proc] | None = None,
               **settings: object) -> Proc:
        port = free_port()
        args = ["-m", "router", "serve", "--host", "127.0.0.1", "--port", str(port),
                "--health-interval-s", "0.5", "--log-level", "warning"]
        if redis_url:
            args += ["--redis-url", redis_url]
        if workers:
            args += ["--workers", ",".join(f"{w.name}={w.url}" for w in workers)]
        for key, value in settings.items():
            args += ["--" + key.replace("_", "-"), str(value)]
        return self._start(args, f"http://127.0.0.1:{port}", name, "/health",
                           env={"PREFIX_ROUTER_ADMIN_TOKEN": ADMIN_TOKEN})

    def _start(self, args: list[str], url: str, name: str, probe: str,
               env: dict[str, str] | None = None) -> Proc:
        proc = spawn(args, env)
        entry = Proc(proc, url, name)
        self.procs.append(entry)
        wait_http(url + probe, timeout=30, proc=proc)
        return entry

    def close(self) -> None:
        for entry in self.procs:
            stop(entry.proc, signal.SIGTERM, timeout=5)


def admin_workers(router: Proc) -> dict[str, dict]:
    req = urllib.request.Request(router.url + "/admin/workers",
                                 headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    with urllib.request.urlopen(req, timeout=2) as resp:
        return {w["id"]: w for w in json.loads(resp.read())["workers"]}


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    """Seconds until predicate held; fails the test after timeout."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(0.05)
    return time.monotonic() - started


def contexts(n: int, chars: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        words: list[str] = [f"document-{i}"]
        while sum(len(w) + 1 for w in words) < chars:
            words.append(rng.choice(WORDS) + str(rng.randrange(1000)))
        docs.append(" ".join(words))
    return docs


def rag_question(i: int) -> str:
    """A question whose own text fills more than a block (256 chars) after its unique part,
    so the routing key (last full block when the prompt is shorter than the key window)
    differs per request: only residency can then bring a context back to its worker."""
    return f"question {i}: " + "explain the relevant passage in detail, " * 8


def rag_body(doc: str, question: str, max_tokens: int = 2) -> dict:
    return {"model": MODEL, "max_tokens": max_tokens, "messages": [
        {"role": "system", "content": "Answer from the context."},
        {"role": "user", "content": f"Context:\n{doc}\n\nQuestion: {question}"}]}


@dataclass
class Outcome:
    context: int
    router: str
    status: int
    worker: str
    reason: str = ""


async def run_stream(jobs: list[tuple[int, Proc, dict]], concurrency: int,
                     on_done: Callable[[int], None] | None = None) -> list[Outcome]:
    """Send (context, router, body) jobs in order with ``concurrency`` clients."""
    queue: asyncio.Queue[tuple[int, Proc, dict]] = asyncio.Queue()
    for job in jobs:
        queue.put_nowait(job)
    results: list[Outcome] = []

    async def client(session: aiohttp.ClientSession) -> None:
        while not queue.empty():
            ctx, router, body = queue.get_nowait()
            try:
                async with session.post(router.url + "/v1/chat/completions", json=body) as resp:
                    await resp.read()
                    worker = resp.headers.get("X-Prefix-Router-Worker", "")
                    reason = resp.headers.get("X-Prefix-Router-Reason", "")
                    results.append(Outcome(ctx, router.name, resp.status, worker, reason))
            except aiohttp.ClientError as exc:
                results.append(Outcome(ctx, router.name, 0, repr(exc)))
            if on_done is not None:
                on_done(len(results))

    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
    return results
