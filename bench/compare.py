"""``python -m bench compare``: one workload, one seed, every policy; a table and plots.

Each policy gets a fresh, cold fleet and the identical request sequence. A policy that
cannot run here (a peer router that is not installed or does not start) becomes a row
that says why, instead of stopping the comparison.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

import orjson

from bench import gateway as envoy_gateway
from bench import plots
from bench.analysis import engine_ttft
from bench.cli import run_config
from bench.runner import log, run

COLUMNS = ("policy", "hit rate", "unbounded / fleet-LRU bound", "TTFT p50 / p90 / p99 (ms)",
           "p50 / p99 vs RR", "engine TTFT p50 / p90 / p99 (ms)", "engine server + hop p50 (ms)",
           "req/s", "max/mean req", "max/mean busy", "router CPU µs/req", "ok/total")


def parse_policy(spec: str) -> tuple[str, float | None, str | None]:
    """'prefix_aware@0.1+hdr' -> (policy, epsilon, X-Context-Hash scope or None).

    ``+hdr`` sends X-Context-Hash over the whole retrieved context (the SDK's contract),
    ``+hdr1`` over the first document only (an application's own key).
    """
    scope = None
    for suffix, value in (("+hdr1", "first"), ("+hdr", "all")):
        if spec.endswith(suffix):
            spec, scope = spec.removesuffix(suffix), value
            break
    name, _, eps = spec.partition("@")
    return name, float(eps) if eps else None, scope


def _f(x: float | None, fmt: str) -> str:
    return "–" if x is None else format(x, fmt)


def row(res: dict[str, Any], rr: dict[str, Any] | None) -> list[str]:
    t, b = res["ttft_ms"], res.get("bounds") or {}
    e = engine_ttft(res)
    lag, hop = res.get("engine_server_ms") or {}, res.get("hop_ms") or {}
    vs = "–"
    if rr and rr["ttft_ms"]["p50"] and t["p50"]:
        vs = f"{t['p50'] / rr['ttft_ms']['p50']:.2f}x / {t['p99'] / rr['ttft_ms']['p99']:.2f}x"
    return [res["meta"]["label"], _f(res["hit_rate"] and 100 * res["hit_rate"], ".1f") + " %",
            f"{_f(100 * b.get('unbounded_hit_rate', 0), '.1f')} / "
            f"{_f(100 * b.get('fleet_lru_hit_rate', 0), '.1f')} %",
            f"{_f(t['p50'], '.0f')} / {_f(t['p90'], '.0f')} / {_f(t['p99'], '.0f')}", vs,
            f"{_f(e['p50'], '.0f')} / {_f(e['p90'], '.0f')} / {_f(e['p99'], '.0f')}",
            f"{_f(lag.get('p50'), '.1f')} + {_f(hop.get('p50'), '.1f')}",
            _f(res["throughput"]["requests_per_s"], ".2f"),
            _f(res["load"]["requests_max_over_mean"], ".2f"),
            _f(res["load"]["busy_max_over_mean"], ".2f"),
            _f(res["router_cpu"]["us_per_request"], ".0f"),
            f"{res['requests']['ok']}/{res['requests']['total']}"]


def table(results: list[dict[str, Any]], failures: list[tuple[str, str]], caption: str) -> str:
    rr = next((r for r in results if r["meta"]["policy"] == "round_robin"), None)
    lines = [f"`{caption}`", "", "| " + " | ".join(COLUMNS) + " |",
             "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row(r, rr)) + " |" for r in results]
    lines += [f"| {label} | not run: {why} |" + " |" * (len(COLUMNS) - 2)
              for label, why in failures]
    return "\n".join(lines) + "\n"


def compare(args: argparse.Namespace) -> list[dict[str, Any]]:
    caption = "python -m bench " + shlex.join(args.argv)
    name = args.name or args.workload
    out_dir: Path = args.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    results, failures = [], []
    for spec in [s for s in args.policies.split(",") if s]:
        # +envoy: the same policy as Envoy's endpoint picker (response bodies observed off
        # the data path); +envoy-lean: they bypass the picker; +envoy-inline: they pass it;
        # +envoy-held: the body streamed, the pick held for it (one round trip, not two)
        base, _, gateway = spec.partition("+envoy")
        policy, eps, scope = parse_policy(base)
        cfg = run_config(args, policy=policy, label=spec, out=out_dir / f"{name}-{spec}.json")
        if "+envoy" in spec:
            cfg.gateway = gateway[1:] or "observed"
            if cfg.gateway not in envoy_gateway.MODES:
                raise SystemExit(f"{spec}: +envoy takes -{', -'.join(envoy_gateway.MODES[1:])}"
                                 " or nothing")
        if eps is not None:
            cfg.epsilon = eps
        if scope:
            cfg.workload_opts = {**cfg.workload_opts, "send_context_hash": True,
                                 "context_hash_scope": scope}
        try:
            results.append(run(cfg))
        except Exception as exc:  # noqa: BLE001 - one broken contender must not stop the rest
            why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            log(f"[bench] {spec}: FAILED {why}")
            failures.append((spec, why))
    md = table(results, failures, caption)
    (out_dir / f"{name}.md").write_text(md)
    summary = [{k: v for k, v in r.items() if k != "records"} for r in results]
    (out_dir / f"{name}-summary.json").write_bytes(
        orjson.dumps({"caption": caption, "results": summary, "failures": failures},
                     option=orjson.OPT_INDENT_2))
    if results:
        draw(results, out_dir, name, caption)
    print(md)
    return results


def draw(results: list[dict[str, Any]], out_dir: Path, name: str, caption: str) -> None:
    plots.ttft_cdf(results, out_dir / f"{name}-ttft-cdf.png", caption)
    plots.hit_rate_p99(results, out_dir / f"{name}-hit-p99.png", caption)
    plots.worker_load(results, out_dir / f"{name}-load.png", caption)


def replot(out_dir: Path, name: str) -> None:
    """Table and plots again from a finished comparison's files (no run)."""
    summary = orjson.loads((out_dir / f"{name}-summary.json").read_bytes())
    results = [orjson.loads((out_dir / f"{name}-{r['meta']['label']}.json").read_bytes())
               for r in summary["results"]]
    failures = [tuple(f) for f in summary["failures"]]
    (out_dir / f"{name}.md").write_text(table(results, failures, summary["caption"]))
    draw(results, out_dir, name, summary["caption"])
