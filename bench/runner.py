"""``python -m bench run``: one workload through one policy on a fresh simulated fleet.

Every run starts its workers cold, so policies are compared on the same request
sequence from the same empty caches. The worker KV size can be chosen from the
workload's working set (``--cache-fleet-ratio``) so that the working set is larger
than one worker's cache and smaller than the fleet's: the regime where routing matters.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench import analysis, bounds, dynamo, fleet, gateway, peers, scrape
from bench.loadgen import drive
from bench.workloads import BenchRequest, make_workload

DEFAULT_BLOCKS = {"llama-3-8b@h100-80gb": 26674}


@dataclass
class RunConfig:
    workload: str = "rag"
    workload_opts: dict[str, Any] = field(default_factory=dict)
    policy: str = "prefix_aware"  # a prefix-router policy, or a peer name (peers.PEERS)
    epsilon: float = 0.25
    workers: int = 8
    profile: str = "llama-3-8b@h100-80gb"
    time_scale: float = 1.0
    num_gpu_blocks: int | None = None
    cache_fleet_ratio: float | None = None  # fleet cache = ratio x working set
    max_model_len: int | None = None
    block_size: int = 16  # the workers' KV block size (tokens)
    max_duration_s: float | None = None  # wall seconds of sending
    router_url: str | None = None
    worker_urls: list[str] = field(default_factory=list)
    router_extra: list[str] = field(default_factory=list)
    # the policy in prefix-router epp behind Envoy (bench/gateway.py): "" (no), or the
    # gateway mode: "observed" (as shipped), "lean" or "inline"
    gateway: str = ""
    label: str = ""
    out: Path | None = None
    logdir: Path = Path("/tmp/prefix-router-bench")
    progress: bool = True


def log(msg: str) -> None:
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


def plan_blocks(cfg: RunConfig, requests: list[BenchRequest]) -> tuple[int, int]:
    """(worker KV blocks, working set blocks): explicit, derived from the ratio, or default."""
    working = len({b for r in requests for b in bounds.prompt_chain(r.prompt)})
    if cfg.num_gpu_blocks:
        blocks = cfg.num_gpu_blocks
    elif cfg.cache_fleet_ratio:
        blocks = math.ceil(working * cfg.cache_fleet_ratio / cfg.workers)
    else:
        blocks = DEFAULT_BLOCKS.get(cfg.profile, 0)
    longest = max((r.prompt_tokens + r.max_tokens) for r in requests) // cfg.block_size + 2
    return max(blocks, longest), working


async def _measure(cfg: RunConfig, requests: list[BenchRequest], sut: SystemUnderTest,
                   meta: dict[str, Any], bound: dict[str, Any] | None) -> dict[str, Any]:
    router_url, worker_urls, router_pid = sut.router_url, sut.worker_urls, sut.router_pid
    async with aiohttp.ClientSession() as session:
        before = await scrape.scrape(session, worker_urls)
        cpu0 = fleet.cpu_seconds(router_pid) if router_pid else None
        records, wall = await drive(router_url, requests, cfg.time_scale, model=fleet.MODEL,
                                    max_duration_s=cfg.max_duration_s, progress=cfg.progress)
        cpu1 = fleet.cpu_seconds(router_pid) if router_pid else None
        await asyncio.sleep(0.2)  # let the engines finish their bookkeeping of the last step
        after = await scrape.scrape(session, worker_urls)
        engine_ttfts = await scrape.engine_ttfts(session, worker_urls)
        ours = (await scrape.scrape(session, [sut.metrics_url]))[0] if sut.metrics_url else None
    deltas = [scrape.delta(b, a) for b, a in zip(before, after, strict=True)]
    result = analysis.summarize(records, time_scale=cfg.time_scale, wall_s=wall,
                                worker_urls=worker_urls, worker_ids=sut.worker_ids,
                                deltas=deltas, engine_ttfts=engine_ttfts,
                                router_cpu_s=(cpu1 - cpu0) if cpu0 is not None else None,
                                bounds=bound, meta=meta)
    if ours is not None:
        result["router_counters"] = scrape.router_counters(ours)
    return result


def run(cfg: RunConfig) -> dict[str, Any]:
    t0 = time.perf_counter()
    requests = make_workload(cfg.workload, **cfg.workload_opts)
    if not requests:
        raise SystemExit("the workload is empty")
    blocks, working = plan_blocks(cfg, requests)
    bound = bounds.compute(requests, blocks, cfg.workers).as_dict()
    log(f"[bench] {cfg.workload}: {len(requests)} requests over "
        f"{requests[-1].arrival_s:.1f} simulated s, {bound['prompt_tokens']:,} prompt tokens; "
        f"working set {working:,} blocks vs one worker's cache {blocks:,} and the fleet's "
        f"{blocks * cfg.workers:,} ({cfg.workers} workers) -> "
        f"{_regime(working, blocks, cfg.workers)}; upper bounds: unbounded "
        f"{bound['unbounded_hit_rate']:.1%}, fleet-size LRU {bound['fleet_lru_hit_rate']:.1%}"
        f" (built in {time.perf_counter() - t0:.1f}s)")
    label = cfg.label or cfg.policy
    meta = {"workload": cfg.workload, "workload_opts": cfg.workload_opts, "policy": cfg.policy,
            "label": label, "epsilon": cfg.epsilon, "workers": cfg.workers,
            "profile": cfg.profile, "time_scale": cfg.time_scale, "num_gpu_blocks": blocks,
            "working_set_blocks": working, "regime": _regime(working, blocks, cfg.workers),
            "command": " ".join(sys.argv), "router_extra": cfg.router_extra}
    procs: list[fleet.Proc] = []
    logdir = cfg.logdir / f"{cfg.workload}-{label}-{int(time.time())}"
    try:
        sut = start_system(cfg, requests, blocks, logdir, procs)
        log(f"[bench] {label}: fleet up ({time.perf_counter() - t0:.1f}s), driving load")
        result = asyncio.run(_measure(cfg, requests, sut, meta, bound))
    finally:
        stop_all(procs)
    log(f"[bench] {label}: hit rate {_fmt(result['hit_rate'])}, TTFT p50/p99 "
        f"{_ms(result['ttft_ms']['p50'])}/{_ms(result['ttft_ms']['p99'])} ms simulated, "
        f"ok {result['requests']['ok']}/{result['requests']['total']}, max/mean load "
        f"{_num(result['load']['requests_max_over_mean'])}")
    if cfg.out:
        cfg.out.parent.mkdir(parents=True, exist_ok=True)
        cfg.out.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    return result


@dataclass
class SystemUnderTest:
    """The started router and the workers it routes to, as a driver needs them."""

    router_url: str
    worker_urls: list[str]
    router_pid: int | None  # for the router's CPU time; None when not ours
    worker_ids: list[str] | None  # the X-Worker header values, in worker_urls order
    metrics_url: str | None = None  # prefix-router's own /metrics (proxy or picker)


def start_system(cfg: RunConfig, requests: list[BenchRequest], blocks: int, logdir: Path,
                 procs: list[fleet.Proc]) -> SystemUnderTest:
    """Fresh cold workers and cfg.policy's router; every started process goes into procs."""
    worker_urls = list(cfg.worker_urls)
    if not worker_urls:
        longest = max(r.prompt_tokens + r.max_tokens for r in requests)
        # the profile's 8,192 would reject long RAG/trace prompts (Llama-3.1: 128 k)
        max_len = cfg.max_model_len or -(-(longest + 16) // 1024) * 1024
        spec = fleet.WorkerSpec(profile=cfg.profile, time_scale=cfg.time_scale,
                                num_gpu_blocks=blocks, max_model_len=max_len,
                                extra=["--block-size", str(cfg.block_size)])
        if cfg.policy == "dynamo_kv":  # workers publish KV events to Dynamo's shim
            workers, dyn_router = dynamo.start_dynamo(cfg.workers, spec, logdir)
            procs += [*workers, dyn_router]
            worker_urls = [w.url for w in workers]
        else:
            procs += fleet.start_workers(cfg.workers, spec, logdir)
            worker_urls = [p.url for p in procs]
    ids = [f"w{i}" for i in range(len(worker_urls))]
    if cfg.router_url:
        return SystemUnderTest(cfg.router_url, worker_urls, None, None)
    if cfg.policy == "dynamo_kv":
        if cfg.worker_urls:
            raise SystemExit("dynamo_kv starts its own workers, with KV events on")
        return SystemUnderTest(dyn_router.url, worker_urls, dyn_router.popen.pid, ids)
    if cfg.policy in peers.PEERS:
        peer = peers.start_peer(cfg.policy, worker_urls, logdir)
        procs.append(peer)
        return SystemUnderTest(peer.url, worker_urls, peer.popen.pid, None)
    rblocks = fleet.residency_capacity(blocks, 256, cfg.block_size)
    if cfg.gateway:  # router CPU is the picker's; Envoy's is not counted
        picker, grpc_port = gateway.start_picker(
            worker_urls, cfg.policy, logdir, extra=[
                "--bound-epsilon", str(cfg.epsilon), "--residency-capacity", str(rblocks),
                *cfg.router_extra])
        procs.append(picker)
        envoy = gateway.start_envoy(gateway.envoy_config(
            fleet.free_port(), fleet.free_port(), ("127.0.0.1", grpc_port), worker_urls,
            mode=cfg.gateway), logdir)
        procs.append(envoy)
        return SystemUnderTest(envoy.url, worker_urls, picker.popen.pid, ids, picker.url)
    router = fleet.start_router(worker_urls, cfg.policy, logdir, epsilon=cfg.epsilon,
                                residency_blocks=rblocks, extra=cfg.router_extra)
    procs.append(router)
    return SystemUnderTest(router.url, worker_urls, router.popen.pid, ids, router.url)


def stop_all(procs: list[fleet.Proc]) -> None:
    """Stop in reverse start order (router before workers); never raise while unwinding."""
    for p in reversed(procs):
        with contextlib.suppress(Exception):
            p.stop()


def _regime(working: int, blocks: int, workers: int) -> str:
    if working <= blocks:
        return "fits one worker"
    if working <= blocks * workers:
        return "larger than one worker, smaller than the fleet"
    return "larger than the fleet"


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0f}"


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"
