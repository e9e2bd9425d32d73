"""``python -m bench aiperf``: the Mooncake replay driven by NVIDIA's aiperf, not our loadgen.

aiperf (PyPI ``aiperf``, its own ``.venv-aiperf``: ``make aiperf-env``) is the load
generator Dynamo publishes its router results with. Here it replays the same Mooncake rows
the bench's ``mooncake`` workload selects (window, conversation sample, arrival scale),
written in aiperf's ``mooncake_trace`` format: ``timestamp`` (ms, already scaled),
``output_length`` and, as the prompt, ``text_input``: the bench's own text for that row
(one fixed 512-token block per hash id), so the engines see exactly the tokens the bench's
replay sends (aiperf accepts ``hash_ids`` only with ``input_length``). aiperf's own
synthesis from ``input_length`` would tokenise with its tokenizer (``builtin`` needs a
download, o200k_base), and the simulator's tokenizer would count that text differently:
a different workload. aiperf
sends on its own fixed schedule (``--fixed-schedule``), streaming, to the router, and its
TTFT percentiles come from its JSON export (``profile_export_aiperf.json``). The fleet
and router are started exactly as ``bench run`` starts them (``runner.start_system``),
and the engines' own hit rate and TTFT come from the same before/after scrape, so a user
can check our figures with a tool no one here wrote.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench import analysis, bounds, fleet, runner, scrape
from bench.cli import run_config, workload_opts
from bench.workloads import make_workload, mooncake

EXPORT = "profile_export_aiperf.json"
PERCENTILES = ("p50", "p90", "p99")


def aiperf_rows(rows: Iterable[dict], arrival_scale: float) -> list[dict]:
    """Trace rows -> aiperf mooncake_trace rows: timestamps from the first row, scaled.

    The prompt is the bench's own text for the row (``mooncake.prompt_for``), whose
    token count under the simulator's tokenizer is the row's ``input_length``.
    """
    rows = list(rows)
    if not rows:
        return []
    t0 = rows[0]["timestamp"]
    return [{"timestamp": round((r["timestamp"] - t0) * arrival_scale, 3),
             "text_input": mooncake.prompt_for(r)[0],
             "output_length": max(1, int(r["output_length"]))} for r in rows]


def validate(aiperf: Path, trace: Path) -> None:
    """Fail before any fleet starts if aiperf's own MooncakeTrace model rejects a row."""
    code = ("import sys, orjson; from aiperf.dataset.loader.models import MooncakeTrace; "
            "[MooncakeTrace.model_validate(orjson.loads(x)) for x in open(sys.argv[1], 'rb')]")
    subprocess.run([str(aiperf.parent / "python"), "-c", code, str(trace)], check=True)


def build_tokenizer(aiperf: Path, out: Path) -> Path:
    """A local tokenizer for aiperf's token counting (scripts/make_tiny_model.py's, no hub).

    aiperf needs one to count ISL/OSL; TTFT does not depend on it.
    """
    if not (out / "tokenizer.json").exists():
        code = ("import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); "
                "from make_tiny_model import build_tokenizer; "
                "build_tokenizer(Path(sys.argv[2]), 4096, 0)")
        subprocess.run([str(aiperf.parent / "python"), "-c", code, str(fleet.REPO / "scripts"),
                        str(out)], check=True)
    return out


def write_trace(path: Path, rows: Sequence[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))


def aiperf_command(aiperf: Path, router_url: str, trace: Path, artifacts: Path,
                   tokenizer: Path, timeout_s: float) -> list[str]:
    """aiperf profile against an OpenAI completions endpoint, on the trace's own schedule."""
    return [str(aiperf), "profile", "--model", fleet.MODEL, "--tokenizer", str(tokenizer),
            "--url", router_url, "--endpoint-type", "completions", "--streaming",
            "--input-file", str(trace), "--custom-dataset-type", "mooncake_trace",
            "--fixed-schedule",
            "--request-timeout-seconds", str(int(timeout_s)),
            "--artifact-dir", str(artifacts), "--ui-type", "none"]


def aiperf_metrics(export: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The metric entries of aiperf's JSON export (each a dict with a ``unit``)."""
    return {k: v for k, v in export.items() if isinstance(v, dict) and "unit" in v}


def _find_export(artifacts: Path) -> Path:
    found = sorted(artifacts.rglob(EXPORT))
    if not found:
        raise RuntimeError(f"aiperf wrote no {EXPORT} under {artifacts}")
    return found[0]


async def _scrape(urls: Sequence[str]) -> list[scrape.Snapshot]:
    async with aiohttp.ClientSession() as session:
        return await scrape.scrape(session, urls)


def run_policy(cfg: runner.RunConfig, rows: list[dict], trace: Path, work: Path,
               aiperf: Path, bound: dict[str, Any]) -> dict[str, Any]:
    """One policy: a fresh cold fleet and router, aiperf against it, the engines' deltas."""
    requests = make_workload(cfg.workload, **cfg.workload_opts)
    blocks, _ = runner.plan_blocks(cfg, requests)
    procs: list[fleet.Proc] = []
    logdir = cfg.logdir / f"aiperf-{cfg.policy}-{int(time.time())}"
    artifacts = work / cfg.policy
    last_s = rows[-1]["timestamp"] / 1000.0
    try:
        sut = runner.start_system(cfg, requests, blocks, logdir, procs)
        cmd = aiperf_command(aiperf, sut.router_url, trace, artifacts,
                             work / "tokenizer", timeout_s=600)
        runner.log(f"[aiperf] {cfg.policy}: fleet up, {shlex.join(cmd)}")
        before = asyncio.run(_scrape(sut.worker_urls))
        t0 = time.perf_counter()
        logdir.mkdir(parents=True, exist_ok=True)
        with open(logdir / "aiperf.log", "wb") as out:
            proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False,
                                  timeout=last_s * cfg.time_scale + 900)
        wall = time.perf_counter() - t0
        time.sleep(0.2)  # let the engines finish their bookkeeping of the last step
        after = asyncio.run(_scrape(sut.worker_urls))
    finally:
        runner.stop_all(procs)
    if proc.returncode != 0:
        tail = (logdir / "aiperf.log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"aiperf exited {proc.returncode}: {tail}")
    metrics = aiperf_metrics(orjson.loads(_find_export(artifacts).read_bytes()))
    deltas = [scrape.delta(b, a) for b, a in zip(before, after, strict=True)]
    return summarize(cfg, rows, metrics, deltas, wall, bound, shlex.join(cmd))


def summarize(cfg: runner.RunConfig, rows: Sequence[dict], metrics: dict[str, dict[str, Any]],
              deltas: Sequence[scrape.Snapshot], wall_s: float, bound: dict[str, Any],
              command: str) -> dict[str, Any]:
    input_tokens = bound.get("prompt_tokens", 0)
    fleet_delta = scrape.add(deltas)
    queries = fleet_delta.get("vllm:prefix_cache_queries_total", 0.0)
    hits = fleet_delta.get("vllm:prefix_cache_hits_total", 0.0)
    per_worker = [int(d.get("vllm:request_success_total", 0.0)) for d in deltas]
    mean = sum(per_worker) / len(per_worker) if per_worker else 0.0
    ttft = metrics.get("time_to_first_token", {})
    return {
        "policy": cfg.policy, "aiperf_command": command, "wall_s": wall_s,
        "trace_rows": len(rows), "trace_input_tokens": input_tokens,
        "engine_prompt_tokens": fleet_delta.get("vllm:prompt_tokens_total", 0.0),
        "aiperf_ttft_ms": {p: ttft.get(p) for p in ("avg", *PERCENTILES)},
        "aiperf_unit": ttft.get("unit"),
        "aiperf_requests": {k: (metrics.get(k) or {}).get("avg")
                            for k in ("request_count", "error_request_count")},
        "worker_ttft_ms": analysis.histogram_ms(fleet_delta, analysis.TTFT),
        "hit_rate": hits / queries if queries else None,
        "engine_requests": per_worker,
        "requests_max_over_mean": max(per_worker) / mean if mean else None,
        "bounds": bound, "aiperf_metrics": metrics,
    }


def _f(x: float | None, fmt: str) -> str:
    return "–" if x is None else format(x, fmt)


COLUMNS = ("policy", "aiperf TTFT p50 / p90 / p99 (ms)", "engine TTFT p50 / p90 / p99 (ms)",
           "hit rate", "% of fleet-LRU bound", "requests ok (aiperf) / engine",
           "aiperf errors", "max/mean req", "engine / trace prompt tokens")


def row(res: dict[str, Any]) -> list[str]:
    a, e = res["aiperf_ttft_ms"], res["worker_ttft_ms"]
    hit, lru = res["hit_rate"], (res["bounds"] or {}).get("fleet_lru_hit_rate")
    req = res["aiperf_requests"]
    return [res["policy"], " / ".join(_f(a[p], ".0f") for p in PERCENTILES),
            " / ".join(_f(e[p], ".0f") for p in PERCENTILES),
            _f(hit and 100 * hit, ".1f") + " %",
            _f(100 * hit / lru if hit is not None and lru else None, ".0f"),
            f"{_f(req['request_count'], '.0f')} / {sum(res['engine_requests'])}",
            _f(req["error_request_count"] or 0, ".0f"),
            _f(res["requests_max_over_mean"], ".2f"),
            f"{res['engine_prompt_tokens'] / max(1, res['trace_input_tokens']):.3f}"]


def table(results: Sequence[dict[str, Any]], failures: Sequence[tuple[str, str]],
          caption: str) -> str:
    lines = [f"`{caption}`", "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row(r)) + " |" for r in results]
    lines += [f"| {p} | not run: {why} |" + " |" * (len(COLUMNS) - 2) for p, why in failures]
    return "\n".join(lines) + "\n"


def compare(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every policy in turn on the same trace file; a table, one JSON per policy."""
    args.workload = "mooncake"
    caption = "python -m bench " + shlex.join(args.argv)
    opts = workload_opts(args)
    mcfg = mooncake.MooncakeConfig(**{k: v for k, v in opts.items()
                                      if k in mooncake.MooncakeConfig.__dataclass_fields__})
    rows = aiperf_rows(mooncake.select(mooncake.load_trace(mcfg.path
                                                           or mooncake.default_trace_path()),
                                       mcfg), mcfg.arrival_scale)
    if not rows:
        raise SystemExit("the Mooncake selection is empty")
    out_dir: Path = args.out_dir
    name = args.name
    trace = Path(args.work_dir) / f"{name}-trace.jsonl"  # ~60 kB a row: not a result
    write_trace(trace, rows)
    validate(Path(args.aiperf), trace)
    requests = make_workload("mooncake", **opts)
    probe = run_config(args)
    blocks, _ = runner.plan_blocks(probe, requests)
    bound = bounds.compute(requests, blocks, probe.workers).as_dict()
    runner.log(f"[aiperf] {len(rows)} rows over {rows[-1]['timestamp'] / 1000:.1f} s -> {trace}")
    work = Path(args.work_dir) / f"{name}-{int(time.time())}"
    build_tokenizer(Path(args.aiperf), work / "tokenizer")
    results, failures = [], []
    for policy in [p for p in args.policies.split(",") if p]:
        cfg = run_config(args, policy=policy, label=policy)
        try:
            res = run_policy(cfg, rows, trace, work, Path(args.aiperf), bound)
        except Exception as exc:  # noqa: BLE001 - one broken contender must not stop the rest
            why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            runner.log(f"[aiperf] {policy}: FAILED {why}")
            failures.append((policy, why))
            continue
        res["caption"] = caption
        (out_dir / f"{name}-{policy}.json").write_bytes(
            orjson.dumps(res, option=orjson.OPT_INDENT_2))
        results.append(res)
        runner.log("[aiperf] " + " | ".join(row(res)))
    md = table(results, failures, caption)
    (out_dir / f"{name}.md").write_text(md)
    sys.stdout.write(md)
    return results
