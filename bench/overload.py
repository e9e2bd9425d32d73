"""``python -m bench overload``: a burst past the fleet's prefill capacity, admission on and off.

Open-loop Poisson arrivals at ``--calm`` x capacity for ``--calm-s``, ``--burst`` x capacity
for ``--burst-s``, then ``--calm`` x again, from three tenants, one sending ``--heavy`` times
as many requests as each of the others. Each request is a tenant's system prompt (cached
after its first use), a cold document and a question, streamed, with the usage chunk. The
same schedule runs through a router with ``--admission true`` and through one without, on a
fresh simulated fleet each time.

Capacity is the roofline's: workers / the modelled prefill time of the mean request on the
profile (engine_worker/sim/roofline.py). Reported per mode: TTFT of the answered requests
(and how far past their own prefill), 429s and their Retry-After, 5xx and timeouts, how busy
the engines were through the burst (sampled ``num_requests_running + waiting > 0``, and the
uncached tokens computed against the capacity), and each light tenant's uncached tokens
served while contended against its max-min fair share.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench import fleet
from bench.runner import log
from bench.workloads.text import block_text
from engine_worker.sim.profiles import load_profile
from engine_worker.sim.roofline import prefill_seconds

TENANTS = ("heavy", "light-a", "light-b")
SYSTEM_TOKENS = 256
DOC_TOKENS = 1000
QUESTION_TOKENS = 24


@dataclass(frozen=True, slots=True)
class Planned:
    at: float  # seconds after the start
    tenant: str
    phase: str
    prompt: str
    uncached: int  # engine tokens past the tenant's cached system prompt


def capacity_rps(profile: str, workers: int) -> float:
    """Requests/s the fleet can prefill (simulated time), the roofline of the mean request."""
    total = SYSTEM_TOKENS + DOC_TOKENS + QUESTION_TOKENS
    return workers / prefill_seconds(load_profile(profile), total, SYSTEM_TOKENS)


def plan(args: argparse.Namespace, capacity: float) -> list[Planned]:
    rng = random.Random(args.seed)
    weights = [args.heavy, 1.0, 1.0]
    phases = (("calm", args.calm_s, args.calm), ("burst", args.burst_s, args.burst),
              ("after", args.calm_s, args.calm))
    out: list[Planned] = []
    start = 0.0
    for name, length, load in phases:
        rate = load * capacity / args.time_scale  # arrivals per wall second
        t = start + rng.expovariate(rate)
        while t < start + length:
            tenant = rng.choices(TENANTS, weights)[0]
            doc = block_text(f"{tenant}-doc", rng.randrange(10**9), DOC_TOKENS)
            question = block_text("q", rng.randrange(10**9), QUESTION_TOKENS)
            prompt = f"{block_text(tenant, 0, SYSTEM_TOKENS)} {doc} {question}"
            out.append(Planned(t, tenant, name, prompt, DOC_TOKENS + QUESTION_TOKENS))
            t += rng.expovariate(rate)
        start += length
    return out


async def _send(session: aiohttp.ClientSession, url: str, job: Planned, t0: float,
                timeout_s: float) -> dict[str, Any]:
    await asyncio.sleep(max(0.0, t0 + job.at - time.perf_counter()))
    body = orjson.dumps({"model": fleet.MODEL, "prompt": job.prompt, "max_tokens": 16,
                         "stream": True, "stream_options": {"include_usage": True}})
    rec: dict[str, Any] = {"tenant": job.tenant, "phase": job.phase, "sent_s": job.at,
                           "uncached_planned": job.uncached, "status": None,
                           "first_token_s": None, "retry_after": None, "prompt_tokens": None,
                           "cached_tokens": None, "end_s": None}
    sent = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(url + "/v1/completions", data=body,
                                    headers={"Content-Type": "application/json",
                                             "X-Tenant": job.tenant}) as resp:
                rec["status"] = resp.status
                rec["retry_after"] = resp.headers.get("Retry-After")
                if resp.status != 200:
                    with contextlib.suppress(ValueError, AttributeError, TypeError):
                        rec["code"] = orjson.loads(await resp.read())["error"]["code"]
                    return _ended(rec, job, sent)
                async for line in resp.content:
                    if not line.startswith(b"data: {"):
                        continue
                    if rec["first_token_s"] is None and b'"choices":[{' in line:
                        rec["first_token_s"] = job.at + time.perf_counter() - sent
                    if b'"usage":{' in line or b'"usage": {' in line:
                        usage = orjson.loads(line[6:]).get("usage") or {}
                        rec["prompt_tokens"] = usage.get("prompt_tokens")
                        rec["cached_tokens"] = (usage.get("prompt_tokens_details") or {}
                                                ).get("cached_tokens")
                    if b'"error"' in line[:20]:
                        rec["status"] = "stream_error"
    except TimeoutError:
        rec["status"] = "timeout"
    except aiohttp.ClientError as exc:
        rec["status"] = f"client_error:{type(exc).__name__}"
    return _ended(rec, job, sent)


def _ended(rec: dict[str, Any], job: Planned, sent: float) -> dict[str, Any]:
    rec["end_s"] = job.at + time.perf_counter() - sent
    return rec


async def _sample_busy(workers: list[str], t0: float, stop: asyncio.Event,
                       out: list[tuple[float, int, int]]) -> None:
    """(seconds, workers with work, workers sampled) four times a second."""
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            busy = 0
            for url in workers:
                try:
                    async with session.get(url + "/metrics") as resp:
                        text = await resp.text()
                except aiohttp.ClientError:
                    continue
                work = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                           if line.startswith(("vllm:num_requests_running{",
                                               "vllm:num_requests_waiting{")))
                busy += work > 0
            out.append((time.perf_counter() - t0, busy, len(workers)))
            await asyncio.sleep(0.25)


async def _drive(url: str, workers: list[str], jobs: list[Planned],
                 timeout_s: float) -> tuple[list[dict[str, Any]], list[tuple[float, int, int]]]:
    connector = aiohttp.TCPConnector(limit=0)
    samples: list[tuple[float, int, int]] = []
    stop = asyncio.Event()
    async with aiohttp.ClientSession(connector=connector) as session:
        t0 = time.perf_counter() + 0.5
        sampler = asyncio.create_task(_sample_busy(workers, t0, stop, samples))
        records = await asyncio.gather(*(_send(session, url, j, t0, timeout_s) for j in jobs))
        stop.set()
        await sampler
    return list(records), samples


def _run_mode(args: argparse.Namespace, mode: str, jobs: list[Planned],
              logdir: Path) -> dict[str, Any]:
    spec = fleet.WorkerSpec(profile=args.profile, time_scale=args.time_scale)
    procs = fleet.start_workers(args.workers, spec, logdir / mode)
    try:
        rate = 1.0 / prefill_seconds(load_profile(args.profile), 4096) * 4096 / args.time_scale
        extra = ["--prefill-rate", f"{rate:.0f}"]
        if mode == "on":
            extra += ["--admission", "true", "--max-queue-wait-s", str(args.max_queue_wait_s),
                      "--engine-queue-s", str(args.engine_queue_s)]
        router = fleet.start_router([p.url for p in procs], "predicted_ttft", logdir / mode,
                                    extra=extra, name=f"router-{mode}")
        try:
            log(f"overload: admission {mode}, {len(jobs)} requests")
            records, samples = asyncio.run(_drive(router.url, [p.url for p in procs], jobs,
                                                  args.client_timeout_s))
        finally:
            router.stop()
    finally:
        for p in procs:
            p.stop()
    return {"mode": mode, "records": records, "busy": samples, "router_extra": extra}


def overload(args: argparse.Namespace) -> dict[str, Any]:
    from bench.overload_report import report  # matplotlib only when a run reports

    caption = "python -m bench " + shlex.join(args.argv)
    capacity = capacity_rps(args.profile, args.workers)
    jobs = plan(args, capacity)
    own_prefill = prefill_seconds(load_profile(args.profile),
                                  SYSTEM_TOKENS + DOC_TOKENS + QUESTION_TOKENS, SYSTEM_TOKENS)
    meta = {"caption": caption, "capacity_rps": capacity, "workers": args.workers,
            "profile": args.profile, "time_scale": args.time_scale, "calm_s": args.calm_s,
            "burst_s": args.burst_s, "calm": args.calm, "burst": args.burst,
            "heavy": args.heavy, "max_queue_wait_s": args.max_queue_wait_s,
            "engine_queue_s": args.engine_queue_s, "own_prefill_s": own_prefill,
            "capacity_tokens_s": capacity * (DOC_TOKENS + QUESTION_TOKENS),
            "client_timeout_s": args.client_timeout_s}
    logdir = Path("/tmp/prefix-router-bench") / f"overload-{int(time.time())}"
    runs = [_run_mode(args, mode, jobs, logdir) for mode in args.modes.split(",")]
    result = {"meta": meta, "runs": runs}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / f"{args.name}.json").write_text(json.dumps(result))
    text = report(result, args.out_dir, args.name)
    (args.out_dir / f"{args.name}.md").write_text(text)
    print(text)
    return result


def add_parser(sub: Any) -> None:
    o = sub.add_parser("overload", help="a burst past capacity, admission on and off")
    a = o.add_argument
    a("--workers", type=int, default=2)
    a("--profile", default="llama-3-8b@l4",
      help="an L4's prefill keeps the request rate within what one machine can drive")
    a("--time-scale", type=float, default=1.0, help="real seconds per simulated second")
    a("--calm-s", type=float, default=20.0, help="wall seconds before and after the burst")
    a("--burst-s", type=float, default=60.0, help="wall seconds of the burst")
    a("--calm", type=float, default=0.5, help="load before and after, x capacity")
    a("--burst", type=float, default=2.0, help="load in the burst, x capacity")
    a("--heavy", type=float, default=10.0, help="the heavy tenant's rate over each other's")
    a("--max-queue-wait-s", type=float, default=2.0)
    a("--engine-queue-s", type=float, default=0.5)
    a("--client-timeout-s", type=float, default=60.0)
    a("--modes", default="on,off")
    a("--seed", type=int, default=0)
    a("--out-dir", type=Path, default=Path(__file__).resolve().parent / "results")
    a("--name", default="overload")


def fair_shares(demand: dict[str, float], capacity: float) -> dict[str, float]:
    """Max-min fair split of ``capacity`` over ``demand`` (water filling)."""
    share: dict[str, float] = {}
    left = dict(demand)
    room = capacity
    while left:
        level = room / len(left)
        small = {t: d for t, d in left.items() if d <= level}
        if not small:
            share.update({t: level for t in left})
            break
        for t, d in small.items():
            share[t] = d
            room -= d
            del left[t]
    return share
