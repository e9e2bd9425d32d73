"""``python -m bench overhead``: what the router hop costs, against an upstream that costs nothing.

Closed-loop clients (concurrency C) send small completions back to back: directly to one
fast upstream, then through each router in front of the same upstream. The load
generator is pinned to CPU 0 and the system under test (upstream, router, Redis) to
CPU 1, so the two do not steal each other's core. Results are quoted as ratios to the
direct path measured in the same run, because absolute numbers on a shared 2-core
machine move from minute to minute.

Targets: ``direct``; ``aiohttp_relay`` (bench/aiohttp_relay.py: aiohttp on uvloop reading
and forwarding, nothing else, the floor under any aiohttp gateway); prefix-router as
``prefix_router`` (its default policy, predicted_ttft; up to s33 this row ran the previous
default, prefix_aware), ``prefix_router_POLICY`` for any other of its policies
(``prefix_router_round_robin``, ``prefix_router_llmd_weighted``, ...),
``prefix_router_redis`` and ``prefix_router_2p`` (``--processes 2`` sharing one Redis, both
pinned to the system-under-test core unless ``--sut-cpus`` gives more); the Rust peers
``sglang_cache_aware``, ``vllm_round_robin`` and ``vllm_cache_aware``. Router CPU is every
process of the target (children included) from /proc; streamed cells also time the first
chunk (TTFT), which a Nagle-style delay in the hop would show.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shlex
import socket
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson

from bench import fleet, gateway, peers
from bench.runner import log
from bench.workloads.text import block_text
from router.config import POLICY_NAMES, RouterConfig

PROMPT = block_text("overhead", 0, 900)  # ~4 KB: a few router chain blocks to hash


async def _cell(url: str, concurrency: int, total: int, stream: bool) -> dict[str, float]:
    body = orjson.dumps({"model": fleet.MODEL, "prompt": PROMPT, "max_tokens": 16,
                         "stream": stream})
    headers = {"Content-Type": "application/json"}
    lat: list[float] = []
    ttft: list[float] = []
    errors = 0
    remaining = total
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async def worker() -> None:
            nonlocal remaining, errors
            while remaining > 0:
                remaining -= 1
                t = time.perf_counter()
                try:
                    async with session.post(url + "/v1/completions", data=body,
                                            headers=headers) as resp:
                        if stream:
                            await resp.content.readany()
                            ttft.append(time.perf_counter() - t)
                        await resp.read()
                        if resp.status != 200:
                            errors += 1
                except aiohttp.ClientError:
                    errors += 1
                lat.append(time.perf_counter() - t)

        for _ in range(min(50, total)):  # warm the connection pools
            async with session.post(url + "/v1/completions", data=body, headers=headers) as r:
                await r.read()
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    arr = np.asarray(lat) * 1000.0
    out = {"rps": len(lat) / wall, "p50_ms": float(np.percentile(arr, 50)),
           "p99_ms": float(np.percentile(arr, 99)), "errors": errors, "n": len(lat)}
    if ttft:
        out["ttft_p50_ms"] = float(np.percentile(np.asarray(ttft) * 1000.0, 50))
    return out


# target -> (peer, its policy): the Rust routers as they ship, apart from the policy
PEER_TARGETS = {"sglang_cache_aware": ("sglang_cache_aware", "cache_aware"),
                "vllm_cache_aware": ("vllm_cache_aware", "cache_aware"),
                "vllm_round_robin": ("vllm_cache_aware", "round_robin")}
REDIS_TARGETS = ("prefix_router_redis", "prefix_router_2p")
DEFAULT_POLICY = RouterConfig().policy  # the hop a user gets: what ships


def _start_target(name: str, upstream: str, logdir: Path, sut: set[int],
                  redis_url: str | None) -> list[fleet.Proc]:
    """The target's processes, the one clients call first (none: direct)."""
    if name == "direct":
        return []
    if name in PEER_TARGETS:
        peer, policy = PEER_TARGETS[name]
        return [peers.start_peer(peer, [upstream], logdir, policy=policy, cpus=sut)]
    if name == "aiohttp_relay":  # aiohttp alone: the floor under prefix-router's hop
        port = fleet.free_port()
        return [fleet.launch(name, [sys.executable, "-m", "bench.aiohttp_relay", str(port),
                                    upstream], f"http://127.0.0.1:{port}", logdir,
                             ready_path="/ready", cpus=sut)]
    if name == "envoy":  # Envoy alone (least-request): the floor under envoy_picker
        config = gateway.envoy_config(fleet.free_port(), fleet.free_port(), None, [upstream])
        return [gateway.start_envoy(config, logdir, cpus=sut)]
    if name == "envoy_null_picker":  # the gRPC exchange alone: no decision, no accounting
        grpc_port = fleet.free_port()
        picker = fleet.spawn("null_picker", [sys.executable, "-m", "bench.null_picker",
                                             str(grpc_port), upstream.split("://", 1)[1]],
                             upstream, logdir, cpus=sut)
        try:
            _wait_listening(grpc_port)
            config = gateway.envoy_config(fleet.free_port(), fleet.free_port(),
                                          ("127.0.0.1", grpc_port), [upstream])
            return [gateway.start_envoy(config, logdir, cpus=sut), picker]
        except Exception:
            picker.stop()
            raise
    if name.startswith("envoy_picker"):  # Envoy carries the bytes, prefix-router epp decides
        picker, grpc_port = gateway.start_picker([upstream], DEFAULT_POLICY, logdir, cpus=sut)
        try:  # _lean: the response body does not reach the picker (no usage read);
            # _inline: it passes the picker chunk by chunk (bench/gateway.py)
            mode = name.removeprefix("envoy_picker").removeprefix("_") or "observed"
            config = gateway.envoy_config(
                fleet.free_port(), fleet.free_port(), ("127.0.0.1", grpc_port), [upstream],
                mode=mode)
            return [gateway.start_envoy(config, logdir, cpus=sut), picker]
        except Exception:
            picker.stop()
            raise
    suffix = name.removeprefix("prefix_router_")
    policy = suffix if suffix in POLICY_NAMES else DEFAULT_POLICY
    extra = {"prefix_router_admission": ["--admission", "true"],
             "prefix_router_2p": ["--processes", "2"]}.get(name, [])
    return [fleet.start_router([upstream], policy, logdir, cpus=sut, name=name, extra=extra,
                               redis_url=redis_url if name in REDIS_TARGETS else None)]


def _wait_listening(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def overhead(args: argparse.Namespace) -> dict[str, Any]:
    caption = "python -m bench " + shlex.join(args.argv)
    ncpu = os.cpu_count() or 1
    gen, sut = ({0}, {1}) if ncpu >= 2 else ({0}, {0})
    if args.sut_cpus:
        sut = {int(c) for c in args.sut_cpus.split(",")}
    os.sched_setaffinity(0, gen)
    logdir = Path("/tmp/prefix-router-bench") / f"overhead-{int(time.time())}"
    concs = [int(c) for c in args.concurrency.split(",")]
    targets = [t for t in args.targets.split(",") if t]
    procs: list[fleet.Proc] = []
    results: dict[str, Any] = {"caption": caption, "cells": [], "failures": {}}
    try:
        port = fleet.free_port()
        up = fleet.launch("upstream", [sys.executable, "-m", "bench.upstream", str(port)],
                          f"http://127.0.0.1:{port}", logdir, cpus=sut)
        procs.append(up)
        redis_url = None
        if any(t in REDIS_TARGETS for t in targets):
            rport = fleet.free_port()
            redis = fleet.spawn("redis", ["redis-server", "--port", str(rport), "--save", "",
                                          "--appendonly", "no", "--bind", "127.0.0.1"],
                                f"redis://127.0.0.1:{rport}", logdir, cpus=sut)
            procs.append(redis)
            time.sleep(0.5)
            redis_url = redis.url
        for target in targets:
            try:
                target_procs = _start_target(target, up.url, logdir, sut, redis_url)
            except Exception as exc:  # noqa: BLE001 - a peer that cannot start is a row
                results["failures"][target] = str(exc).splitlines()[0][:200]
                log(f"[overhead] {target}: not run: {results['failures'][target]}")
                continue
            url = target_procs[0].url if target_procs else up.url
            try:
                for stream in (False, True):
                    for c in concs:
                        cpu0 = {p.name: fleet.tree_cpu_seconds(p.popen.pid)
                                for p in target_procs}
                        cell = asyncio.run(_cell(url, c, args.requests, stream))
                        sent = cell["n"] + min(50, args.requests)
                        if target_procs:  # every process of the hop (Envoy and its picker)
                            split = {p.name: (fleet.tree_cpu_seconds(p.popen.pid)
                                              - cpu0[p.name]) / sent * 1e6 for p in target_procs}
                            cell["router_cpu_us"] = sum(split.values())
                            if len(split) > 1:
                                cell["cpu_split_us"] = split
                        cell.update(target=target, stream=stream, concurrency=c)
                        results["cells"].append(cell)
                        log(f"[overhead] {target} stream={stream} c={c}: "
                            f"{cell['rps']:.0f} req/s p50 {cell['p50_ms']:.2f} ms "
                            f"p99 {cell['p99_ms']:.2f} ms errors {cell['errors']}")
            finally:
                for proc in target_procs:
                    proc.stop()
    finally:
        for p in reversed(procs):
            with contextlib.suppress(Exception):
                p.stop()
    md = table(results)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    name = getattr(args, "name", None) or "overhead"
    (args.out_dir / f"{name}.md").write_text(md)
    (args.out_dir / f"{name}.json").write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    print(md)
    return results


def table(results: dict[str, Any]) -> str:
    cells = results["cells"]
    direct = {(c["stream"], c["concurrency"]): c for c in cells if c["target"] == "direct"}
    lines = [f"`{results['caption']}`", "",
             "| target | stream | conc | req/s | p50 ms | p99 ms | req/s vs direct | "
             "p50 vs direct | p99 vs direct | TTFT p50 ms | router CPU µs/req | errors |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in cells:
        d = direct.get((c["stream"], c["concurrency"]))
        cpu = c.get("router_cpu_us")

        def ratio(k: str, c: dict[str, Any] = c, d: dict[str, Any] | None = d) -> str:
            return f"{c[k] / d[k]:.2f}x" if d else "–"

        if cpu is not None and "cpu_split_us" in c:
            cpu_text = f"{cpu:.0f} (" + " + ".join(
                f"{name} {us:.0f}" for name, us in c["cpu_split_us"].items()) + ")"
        else:
            cpu_text = "–" if cpu is None else f"{cpu:.0f}"
        lines.append(f"| {c['target']} | {'yes' if c['stream'] else 'no'} | {c['concurrency']} "
                     f"| {c['rps']:.0f} | {c['p50_ms']:.2f} | {c['p99_ms']:.2f} | {ratio('rps')} "
                     f"| {ratio('p50_ms')} | {ratio('p99_ms')} | {_ttft(c)} | {cpu_text} "
                     f"| {c['errors']} |")
    for target, why in results["failures"].items():
        lines.append(f"| {target} | not run: {why} |" + " |" * 10)
    return "\n".join(lines) + "\n"


def _ttft(cell: dict[str, Any]) -> str:
    return f"{cell['ttft_p50_ms']:.2f}" if "ttft_p50_ms" in cell else "–"
