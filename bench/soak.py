"""``python -m bench soak``: steady mixed load over simulated workers while faults hit them.

A router (with Redis behind Sentinel) in front of 4 ``prefix-sim`` workers serves closed-
loop clients (chat and completions, streamed and not, prompts sharing documents) for a
bounded time, while bench/faults.py SIGKILLs, SIGSTOPs and restarts workers, kills the
Redis master and fails Redis over on a schedule. Every request's fate is counted: ``ok``;
``resumed`` (an ok stream whose worker was SIGKILLed or SIGSTOPped while it ran); ``4xx``;
``5xx``; ``error_event``; ``cut`` (no ``[DONE]``); ``short`` (fewer tokens than asked: the
simulator always produces ``max_tokens``); ``timeout`` (the client gave up);
``conn_error``. The router's RSS and open file descriptors are sampled every second; growth
compares the medians of the first and last thirds after warm-up. The result is JSON plus a
table (``--readme`` writes it into bench/README.md).
"""

from __future__ import annotations

import asyncio
import random
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench.faults import Injector, SentinelRedis
from bench.fleet import MODEL, WorkerSpec, start_router, start_workers

LOST = ("5xx", "error_event", "cut", "short", "timeout", "conn_error")
FATES = ("ok", "resumed", "4xx", *LOST)
WORDS = ("cache", "router", "engine", "prefix", "block", "token", "worker", "stream", "kernel",
         "vector", "context", "answer", "paper", "queue", "batch", "decode", "prefill")
README = Path(__file__).resolve().parent / "README.md"
BEGIN, END = "<!-- soak:begin -->", "<!-- soak:end -->"


@dataclass
class SoakConfig:
    seconds: float = 600.0
    workers: int = 4
    clients: int = 12
    warmup_s: float = 30.0
    fault_every_s: float = 15.0
    hang_s: float = 8.0
    down_s: float = 3.0
    client_timeout_s: float = 60.0
    health_interval_s: float = 0.5
    health_timeout_s: float = 0.5
    time_scale: float = 1.0
    seed: int = 0


@dataclass(slots=True)
class Fate:
    path: str
    stream: bool
    max_tokens: int
    start: float
    end: float = 0.0
    worker: str = ""
    fate: str = ""
    detail: str = ""


@dataclass
class Sample:
    at: float
    rss_kb: int
    fds: int


def documents(rng: random.Random, count: int = 24) -> list[str]:
    return [" ".join(rng.choice(WORDS) + str(rng.randrange(100)) for _ in range(300))
            for _ in range(count)]


def build(rng: random.Random, docs: list[str], n: int) -> tuple[str, dict[str, Any]]:
    """A request of the mix: a document (popular ones more often) and a question."""
    doc = docs[min(len(docs) - 1, int(rng.paretovariate(1.2)) - 1)]
    max_tokens = rng.choice((16, 32, 64, 128))
    stream = rng.random() < 0.6
    body: dict[str, Any] = {"model": MODEL, "max_tokens": max_tokens, "stream": stream}
    question = f"question {n}: what does it say about {rng.choice(WORDS)}?"
    if rng.random() < 0.6:
        body["messages"] = [{"role": "user", "content": doc + "\n" + question}]
        return "/v1/chat/completions", body
    body["prompt"] = doc + "\n" + question
    return "/v1/completions", body


async def send(http: aiohttp.ClientSession, url: str, path: str, body: dict[str, Any],
               timeout_s: float, streaming: Counter[str]) -> Fate:
    """One request and its fate; ``streaming`` counts open streams per worker meanwhile."""
    fate = Fate(path, body["stream"], body["max_tokens"], time.monotonic())
    try:
        async with asyncio.timeout(timeout_s), http.post(url + path, json=body) as resp:
            fate.worker = resp.headers.get("X-Prefix-Router-Worker", "")
            streaming[fate.worker] += fate.stream
            try:
                raw = await resp.read()
            finally:
                streaming[fate.worker] -= fate.stream
            fate.fate = judge(resp.status, raw, body)
            if fate.fate != "ok":
                fate.detail = raw[-300:].decode(errors="replace")
    except TimeoutError:
        fate.fate = "timeout"
    except aiohttp.ClientPayloadError as exc:
        fate.fate, fate.detail = "cut", repr(exc)
    except aiohttp.ClientError as exc:
        fate.fate, fate.detail = "conn_error", repr(exc)
    fate.end = time.monotonic()
    return fate


def judge(status: int, raw: bytes, body: dict[str, Any]) -> str:
    if 400 <= status < 500:
        return "4xx"
    if status >= 500:
        return "5xx"
    want = body["max_tokens"]
    if not body["stream"]:
        usage = orjson.loads(raw).get("usage") or {}
        return "ok" if usage.get("completion_tokens") == want else "short"
    events = [e[6:] for e in raw.split(b"\n\n") if e.startswith(b"data: ")]
    if not events or events[-1] != b"[DONE]":
        return "cut"
    chunks = [orjson.loads(e) for e in events[:-1]]
    if any("error" in c for c in chunks):
        return "error_event"
    chat = "messages" in body
    produced = sum(1 for c in chunks for ch in c.get("choices", ())
                   if (ch.get("delta", {}).get("content") if chat else ch.get("text")))
    ids = {c.get("id") for c in chunks}
    return "ok" if produced == want and len(ids) == 1 else "short"


def sample(pid: int) -> Sample:
    with open(f"/proc/{pid}/status") as fh:
        rss = next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))
    return Sample(time.monotonic(), rss, len(list(Path(f"/proc/{pid}/fd").iterdir())))


def growth(samples: list[Sample], since: float, attr: str) -> dict[str, float]:
    """Median of the last third against the first, after warm-up (a third spans faults
    and recoveries alike, so the connection pool's churn evens out; a leak does not)."""
    after = [getattr(s, attr) for s in samples if s.at >= since]
    if len(after) < 6:
        return {"first": 0, "last": 0, "growth": 0.0}
    third = len(after) // 3
    first, last = statistics.median(after[:third]), statistics.median(after[-third:])
    return {"first": first, "last": last, "growth": (last - first) / first if first else 0.0}


async def drive(cfg: SoakConfig, router_url: str, injector: Injector, router_pid: int,
                streaming: Counter[str]) -> tuple[list[Fate], list[Sample], float]:
    rng = random.Random(cfg.seed)
    docs = documents(rng)
    fates: list[Fate] = []
    samples: list[Sample] = []
    counter = iter(range(10**9))
    t0 = time.monotonic()
    end = t0 + cfg.seconds

    async def client(http: aiohttp.ClientSession, crng: random.Random) -> None:
        while time.monotonic() < end:
            path, body = build(crng, docs, next(counter))
            fates.append(await send(http, router_url, path, body, cfg.client_timeout_s,
                                    streaming))
            await asyncio.sleep(crng.uniform(0, 0.2))

    async def sampler() -> None:
        while time.monotonic() < end:
            samples.append(sample(router_pid))
            await asyncio.sleep(1.0)

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        faults = asyncio.create_task(injector.run(t0))
        try:
            await asyncio.gather(sampler(), *(client(http, random.Random(cfg.seed * 1000 + i))
                                              for i in range(cfg.clients)))
            await faults
        finally:
            faults.cancel()
            injector.resume_all()
    return fates, samples, t0


def classify_resumed(fates: list[Fate], injector: Injector, names: dict[str, str]
                     ) -> dict[str, int]:
    """Streams open on a worker when it was SIGKILLed or SIGSTOPped: each must be ok."""
    hits = [(f, i) for f in fates if f.stream for i in injector.log
            if i.fault in ("kill", "stop") and names.get(f.worker) == i.target
            and f.start < i.at < f.end]
    for fate, _ in hits:
        if fate.fate == "ok":
            fate.fate = "resumed"
    killed = [f for f, i in hits if i.fault == "kill"]
    return {"killed_streams": len(killed),
            "killed_streams_resumed": sum(f.fate == "resumed" for f in killed)}


async def router_counters(url: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as http, http.get(url + "/metrics") as resp:
        text = await resp.text()
    keep = ("prefix_router_stream_resumes_total", "prefix_router_retries_total")
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line.startswith(keep)}


def soak(cfg: SoakConfig, out: Path, command: str, readme: bool = False) -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(prefix="soak-"))
    redis = SentinelRedis(run_dir / "redis")
    redis.start()
    workers = start_workers(cfg.workers, WorkerSpec(time_scale=cfg.time_scale), run_dir)
    router = None
    streaming: Counter[str] = Counter()  # open streams by router worker id (w0, w1, ...)

    def busiest() -> int | None:
        worker, count = max(streaming.items(), key=lambda kv: kv[1], default=("", 0))
        return int(worker[1:]) if count > 0 else None

    injector = Injector(workers, redis, run_dir, start_s=cfg.warmup_s, end_s=cfg.seconds,
                        fault_every_s=cfg.fault_every_s, hang_s=cfg.hang_s,
                        down_s=cfg.down_s, busiest=busiest)
    try:
        router = start_router([w.url for w in workers], "predicted_ttft", run_dir,
                              redis_url=redis.url, extra=[
                                  "--health-interval-s", str(cfg.health_interval_s),
                                  "--health-timeout-s", str(cfg.health_timeout_s)])
        fates, samples, t0 = asyncio.run(drive(cfg, router.url, injector, router.popen.pid,
                                               streaming))
        counters = asyncio.run(router_counters(router.url))
    finally:
        if router is not None:
            router.stop()
        injector.resume_all()
        for w in injector.workers:
            w.stop()
        redis.stop()
    names = {f"w{i}": w.name for i, w in enumerate(workers)}
    result = report(cfg, fates, samples, t0, injector, names, counters, command)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    table = markdown(result)
    out.with_suffix(".md").write_text(table)
    if readme:
        write_readme(table)
    print(table)
    return result


def report(cfg: SoakConfig, fates: list[Fate], samples: list[Sample], t0: float,
           injector: Injector, names: dict[str, str], counters: dict[str, float],
           command: str) -> dict[str, Any]:
    resumed = classify_resumed(fates, injector, names)
    counts = Counter(f.fate for f in fates)
    latencies = sorted(f.end - f.start for f in fates)
    since = t0 + cfg.warmup_s
    return {
        "command": command,
        "config": asdict(cfg),
        "requests": len(fates),
        "streams": sum(f.stream for f in fates),
        "fates": {k: counts.get(k, 0) for k in FATES},
        "lost": sum(counts.get(k, 0) for k in LOST),
        **resumed,
        "faults": dict(Counter(i.fault for i in injector.log)),
        "latency_s": {"p50": latencies[len(latencies) // 2] if latencies else 0,
                      "p99": latencies[int(len(latencies) * 0.99)] if latencies else 0,
                      "max": latencies[-1] if latencies else 0},
        "rss_kb": growth(samples, since, "rss_kb"),
        "fds": growth(samples, since, "fds"),
        "router_counters": counters,
        "samples": [(round(s.at - t0, 1), s.rss_kb, s.fds) for s in samples],
        "injected": [(round(i.at - t0, 1), i.fault, i.target) for i in injector.log],
        "not_ok": [asdict(f) for f in fates if f.fate not in ("ok", "resumed", "4xx")][:50],
    }


def markdown(r: dict[str, Any]) -> str:
    fates = r["fates"]
    rows = [f"| {k} | {fates[k]} |" for k in FATES]
    rss, fds, lat = r["rss_kb"], r["fds"], r["latency_s"]
    faults = ", ".join(f"{k} {v}" for k, v in sorted(r["faults"].items()))
    resumes = {k.split('outcome="')[1].rstrip('"}'): int(v)
               for k, v in r["router_counters"].items() if "stream_resumes" in k}
    moved = {k.split('cause="')[1].rstrip('"}'): int(v)
             for k, v in r["router_counters"].items() if "retries" in k}
    return "\n".join([
        f"`{r['command']}`", "",
        f"{r['requests']} requests ({r['streams']} streamed) over {r['config']['seconds']:.0f} s,"
        f" {r['config']['clients']} clients, {r['config']['workers']} workers; faults: {faults}.",
        "", "| fate | requests |", "|---|---|", *rows,
        f"| **lost** (5xx, error event, cut, short, timeout, connection error) | "
        f"**{r['lost']}** |", "",
        f"Streams open on a SIGKILLed worker: {r['killed_streams']}, resumed and ending with "
        f"`[DONE]`: {r['killed_streams_resumed']}. Router counters: resumes {resumes}, "
        f"tries moved {moved}.", "",
        f"Latency p50 {lat['p50']:.2f} s, p99 {lat['p99']:.2f} s, max {lat['max']:.2f} s. "
        f"Router RSS {rss['first'] / 1024:.1f} -> {rss['last'] / 1024:.1f} MiB "
        f"({rss['growth']:+.1%}), open fds {fds['first']:.0f} -> {fds['last']:.0f} "
        f"({fds['growth']:+.1%}), medians of the first and last third after warm-up.", ""])


def write_readme(table: str) -> None:
    text = README.read_text()
    block = f"{BEGIN}\n{table}\n{END}"
    if BEGIN in text:
        head, rest = text.split(BEGIN, 1)
        text = head + block + rest.split(END, 1)[1]
    else:
        text = text.rstrip() + "\n\n## Soak (issue 15)\n\n" + block + "\n"
    README.write_text(text)


def main(args: Any) -> None:
    seconds = args.minutes * 60
    cfg = SoakConfig(seconds=seconds, workers=args.workers, clients=args.clients,
                     warmup_s=args.warmup_s if args.warmup_s is not None
                     else min(30.0, seconds / 6),
                     fault_every_s=args.fault_every_s, hang_s=args.hang_s, seed=args.seed)
    command = "python -m bench " + " ".join(args.argv)
    result = soak(cfg, args.out, command, readme=args.readme)
    if result["lost"] or result["killed_streams_resumed"] != result["killed_streams"]:
        raise SystemExit(1)
