"""Command line: ``python -m bench {run,compare,offline,aiperf,overhead,scale,engine,soak}``."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.engine.cli import add_args as add_engine_args
from bench.runner import RunConfig
from bench.workloads import WORKLOADS

RESULTS = Path(__file__).resolve().parent / "results"
REPO = RESULTS.parent.parent


def _workload_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload (unset options keep the workload's default)")
    a = g.add_argument
    a("--workload", choices=WORKLOADS, default="rag")
    a("--seed", type=int, default=0)
    a("--count", type=int, default=None, help="number of requests")
    a("--rate", type=float, default=None, help="rag/multiturn: arrivals per simulated second")
    a("--docs", type=int, default=None, help="rag: documents in the knowledge base")
    a("--doc-tokens", type=int, default=None, help="rag: median document length")
    a("--alpha", type=float, default=None, help="rag: Zipf exponent of popularity")
    a("--output-tokens", type=int, default=None, help="rag: median output length")
    a("--context-hash", action=argparse.BooleanOptionalAction, default=None,
      help="send X-Context-Hash (rag default: off here, see README)")
    a("--conversations", type=int, default=None, help="multiturn: conversations")
    a("--trace", default=None, help="mooncake: trace path (default ../shared/traces/...)")
    a("--start-s", type=float, default=None, help="mooncake: first trace second replayed")
    a("--duration-s", type=float, default=None, help="mooncake: trace seconds replayed")
    a("--arrival-scale", type=float, default=None, help="mooncake: arrival time factor")
    a("--sample", type=float, default=None, help="mooncake: keep each request with this p")
    a("--sample-conversations", type=float, default=None,
      help="mooncake: keep each conversation (all its turns) with this p")
    a("--max-input-tokens", type=int, default=None, help="mooncake: skip longer prompts")


def _fleet_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("fleet")
    a = g.add_argument
    a("--workers", type=int, default=8)
    a("--profile", default="llama-3-8b@h100-80gb")
    a("--time-scale", type=float, default=1.0, help="real seconds per simulated second")
    a("--num-gpu-blocks", type=int, default=None, help="per worker (default: profile's)")
    a("--cache-fleet-ratio", type=float, default=None,
      help="size worker caches so the fleet's cache is this x the working set")
    a("--max-model-len", type=int, default=None)
    a("--max-duration", type=float, default=None, help="stop sending after this many wall s")
    a("--router-extra", default="", help="extra prefix-router flags, space separated")


def workload_opts(args: argparse.Namespace) -> dict[str, Any]:
    opts = {k: getattr(args, k) for k in
            ("seed", "count", "rate", "docs", "doc_tokens", "alpha", "output_tokens",
             "conversations", "start_s", "duration_s", "arrival_scale", "sample",
             "sample_conversations",
             "max_input_tokens")}
    if args.trace:
        opts["path"] = args.trace
    if args.context_hash is not None:
        opts["send_context_hash"] = args.context_hash
    elif args.workload == "rag":
        opts["send_context_hash"] = False
    return {k: v for k, v in opts.items() if v is not None}


def run_config(args: argparse.Namespace, **over: Any) -> RunConfig:
    cfg = RunConfig(workload=args.workload, workload_opts=workload_opts(args),
                    workers=args.workers, profile=args.profile, time_scale=args.time_scale,
                    num_gpu_blocks=args.num_gpu_blocks, cache_fleet_ratio=args.cache_fleet_ratio,
                    max_model_len=args.max_model_len, max_duration_s=args.max_duration,
                    router_extra=args.router_extra.split() if args.router_extra else [])
    for k, v in over.items():
        setattr(cfg, k, v)
    return cfg


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="one workload through one policy")
    _workload_args(r)
    _fleet_args(r)
    r.add_argument("--policy", default="predicted_ttft",
                   help="prefix-router policy, or sglang_cache_aware / vllm_cache_aware / "
                   "dynamo_kv (Dynamo's selector; run inside unshare -n, see README)")
    r.add_argument("--bound-epsilon", type=float, default=0.25)
    r.add_argument("--router-url", default=None, help="drive this router instead")
    r.add_argument("--worker-urls", default="", help="with --router-url: workers to scrape")
    r.add_argument("--out", type=Path, default=None)
    c = sub.add_parser("compare", help="the same workload through every policy")
    _workload_args(c)
    _fleet_args(c)
    c.add_argument("--policies", default="round_robin,least_loaded,consistent_hash,"
                   "sglang_cache_aware,llmd_weighted,dynamo_kv,prefix_aware,predicted_ttft",
                   help="comma list; prefix_aware@EPS sets epsilon; +hdr sends X-Context-Hash "
                   "of the whole context, +hdr1 of the first document; +envoy runs the "
                   "policy as Envoy's endpoint picker (+envoy-lean, +envoy-inline, "
                   "+envoy-held: bench/gateway.py)")
    c.add_argument("--out-dir", type=Path, default=RESULTS)
    c.add_argument("--name", default=None, help="file stem (default: the workload)")
    off = sub.add_parser("offline", help="every policy on simulated time, in process: "
                         "deterministic, seconds (bench/offline.py)")
    _workload_args(off)
    _fleet_args(off)
    off.add_argument("--policies", default="predicted_ttft,llmd_weighted,consistent_hash,"
                     "least_loaded,round_robin,prefix_aware",
                     help="comma list of router policies; greedy_oracle (bench only, minutes "
                     "a run): each request to the worker that gives it its first token "
                     "soonest, every engine simulated forward")
    off.add_argument("--seeds", default=None,
                     help="comma list of workload seeds (default: --seed): one table row per "
                     "policy and seed, then the first policy's ratio to the best other at "
                     "each percentile, per seed and as geometric means")
    off.add_argument("--burst-gap-ms", type=float, default=None,
                     help="requests due at one instant reach the router this far apart, in "
                     "order (default: as the live load generator sends them, "
                     "bench/offline.py's BURST_GAP_S; 0: at one instant)")
    off.add_argument("--repeats", type=int, default=1,
                     help="replays per policy and seed, each request moved by a different "
                     "jitter under the gap: the percentiles' means and spreads")
    rp = sub.add_parser("replot", help="table and plots again from a comparison's JSON files")
    rp.add_argument("--name", required=True, help="file stem, e.g. rag")
    rp.add_argument("--out-dir", type=Path, default=RESULTS)
    o = sub.add_parser("overhead", help="cost of the hop: direct vs through routers")
    o.add_argument("--requests", type=int, default=2000, help="per cell")
    o.add_argument("--concurrency", default="1,16,64")
    o.add_argument("--targets", default="direct,aiohttp_relay,prefix_router,"
                   "prefix_router_round_robin,prefix_router_redis,sglang_cache_aware,vllm_round_robin,vllm_cache_aware,envoy,"
                   "envoy_picker,envoy_picker_lean")  # also envoy_picker_inline
    o.add_argument("--sut-cpus", default="", help="CPUs of the system under test, e.g. 1,2 "
                   "(default: CPU 1; the load generator keeps CPU 0)")
    o.add_argument("--out-dir", type=Path, default=RESULTS)
    o.add_argument("--name", default="overhead", help="file stem of the table and JSON")
    from bench.overload import add_parser as add_overload
    add_overload(sub)
    s = sub.add_parser("scale", help="policy + residency in process at fleet scale")
    s.add_argument("--workers", default="10,100,1000")
    s.add_argument("--blocks", default="100000,1000000,10000000")
    s.add_argument("--decisions", type=int, default=5000)
    s.add_argument("--out-dir", type=Path, default=RESULTS)
    ap = sub.add_parser("aiperf", help="the Mooncake replay driven by aiperf, every policy")
    _workload_args(ap)
    _fleet_args(ap)
    ap.add_argument("--policies", default="predicted_ttft,llmd_weighted,sglang_cache_aware,"
                    "consistent_hash,round_robin")
    ap.add_argument("--aiperf", default=str(REPO / ".venv-aiperf" / "bin" / "aiperf"))
    ap.add_argument("--work-dir", default="/tmp/prefix-router-bench/aiperf",
                    help="aiperf's artifact directories")
    ap.add_argument("--out-dir", type=Path, default=RESULTS)
    ap.add_argument("--name", default="ttft-aiperf")
    add_engine_args(sub.add_parser("engine", help="the engine-side claims (bench/engine/)"))
    k = sub.add_parser("soak", help="minutes of mixed load while workers and Redis fail")
    k.add_argument("--minutes", type=float, default=10.0)
    k.add_argument("--workers", type=int, default=4)
    k.add_argument("--clients", type=int, default=12, help="closed-loop clients")
    k.add_argument("--warmup-s", type=float, default=None, help="default min(30, run / 6)")
    k.add_argument("--fault-every-s", type=float, default=15.0)
    k.add_argument("--hang-s", type=float, default=8.0, help="how long a SIGSTOP lasts")
    k.add_argument("--seed", type=int, default=0)
    k.add_argument("--out", type=Path, default=RESULTS / "soak.json")
    k.add_argument("--readme", action="store_true", help="write the table into bench/README.md")
    return p


def _exit_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C so every started fleet process is stopped."""
    import signal

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    with contextlib.suppress(ValueError):  # not the main thread (e.g. under a test runner)
        signal.signal(signal.SIGTERM, handler)


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]  # for table captions
    _exit_on_sigterm()
    if args.cmd == "run":
        from bench.runner import run
        urls = [u for u in args.worker_urls.split(",") if u]
        cfg = run_config(args, policy=args.policy, epsilon=args.bound_epsilon,
                         router_url=args.router_url, worker_urls=urls,
                         out=args.out or RESULTS / f"run-{args.workload}-{args.policy}.json")
        run(cfg)
    elif args.cmd == "compare":
        from bench.compare import compare
        compare(args)
    elif args.cmd == "offline":
        from bench.offline import compare as offline_compare
        offline_compare(args)
    elif args.cmd == "replot":
        from bench.compare import replot
        replot(args.out_dir, args.name)
    elif args.cmd == "aiperf":
        from bench.aiperf_replay import compare as aiperf_compare
        aiperf_compare(args)
    elif args.cmd == "engine":
        from bench.engine.cli import run_all
        run_all(args)
    elif args.cmd == "overload":
        from bench.overload import overload
        overload(args)
    elif args.cmd == "overhead":
        from bench.overhead import overhead
        overhead(args)
    elif args.cmd == "soak":
        from bench.soak import main as soak
        soak(args)
    else:
        from bench.scale import scale
        scale(args)
