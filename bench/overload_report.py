"""Tables and plots of ``python -m bench overload``: the acceptance figures per mode."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from bench.analysis import percentile
from bench.overload import fair_shares

LIGHT = ("light-a", "light-b")


def _uncached(r: dict[str, Any]) -> float:
    return float((r["prompt_tokens"] or 0) - (r["cached_tokens"] or 0))


def summarize(meta: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    scale = meta["time_scale"]
    lo, hi = meta["calm_s"], meta["calm_s"] + meta["burst_s"]
    recs = run["records"]
    ok = [r for r in recs if r["status"] == 200 and r["first_token_s"] is not None]
    ttft = [(r["first_token_s"] - r["sent_s"]) / scale for r in ok]
    burst_ttft = [(r["first_token_s"] - r["sent_s"]) / scale for r in ok
                  if r["phase"] == "burst"]
    bound = meta["max_queue_wait_s"] / scale + meta["own_prefill_s"]
    shed = [r for r in recs if r["status"] == 429]
    codes: dict[str, int] = {}
    for r in shed:
        codes[str(r.get("code"))] = codes.get(str(r.get("code")), 0) + 1
    fivexx = sum(1 for r in recs if isinstance(r["status"], int) and r["status"] >= 500)
    timeouts = sum(1 for r in recs if r["status"] == "timeout")
    other = sum(1 for r in recs if r["status"] not in (200, 429, "timeout")
                and not (isinstance(r["status"], int) and r["status"] >= 500))
    window = [b / n for t, b, n in run["busy"] if lo <= t <= hi and n]
    served_in = [r for r in ok if lo <= r["first_token_s"] <= hi]
    computed = sum(_uncached(r) for r in served_in)
    demand = {t: 0.0 for t in ("heavy", *LIGHT)}
    served = dict.fromkeys(demand, 0.0)
    for r in recs:
        if lo <= r["sent_s"] <= hi:
            demand[r["tenant"]] += r["uncached_planned"]
    for r in served_in:
        served[r["tenant"]] += _uncached(r)
    fair = fair_shares(demand, sum(served.values()))
    retry = [float(r["retry_after"]) for r in shed if r["retry_after"] is not None]
    return {
        "mode": run["mode"], "sent": len(recs), "answered": len(ok), "shed": len(shed),
        "shed_codes": codes, "shed_with_retry_after": len(retry), "5xx": fivexx,
        "timeouts": timeouts, "other_errors": other,
        "ttft_p50_s": percentile(ttft, 0.50), "ttft_p99_s": percentile(ttft, 0.99),
        "burst_ttft_p99_s": percentile(burst_ttft, 0.99), "bound_s": bound,
        "within_bound": (sum(1 for v in ttft if v <= bound) / len(ttft)) if ttft else math.nan,
        "busy": float(np.mean(window)) if window else math.nan,
        "prefill_utilisation": computed / (meta["capacity_tokens_s"] * meta["burst_s"] / scale),
        "fair_share": {t: (served[t] / fair[t] if fair.get(t) else math.nan) for t in LIGHT},
        "served_tokens": served, "demand_tokens": demand,
        "retry_after_p50": percentile(retry, 0.50), "retry_after_p90": percentile(retry, 0.90),
    }


def _f(v: float, fmt: str = "{:.2f}") -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)


def table(meta: dict[str, Any], sums: list[dict[str, Any]]) -> str:
    rows = [
        ("requests sent", lambda s: str(s["sent"])),
        ("answered 200", lambda s: str(s["answered"])),
        ("429 (with Retry-After)", lambda s: f"{s['shed']} ({s['shed_with_retry_after']})"),
        ("429 by code", lambda s: ", ".join(f"{k} {v}" for k, v in sorted(s["shed_codes"].items()))
         or "-"),
        ("5xx / timeouts / other errors",
         lambda s: f"{s['5xx']} / {s['timeouts']} / {s['other_errors']}"),
        ("TTFT p50 / p99, answered (s)",
         lambda s: f"{_f(s['ttft_p50_s'])} / {_f(s['ttft_p99_s'])}"),
        ("TTFT p99 of requests sent in the burst (s)", lambda s: _f(s["burst_ttft_p99_s"])),
        (f"answered within wait + own prefill ({_f(sums[0]['bound_s'])} s)",
         lambda s: _f(100 * s["within_bound"], "{:.1f} %")),
        ("engines with work through the burst", lambda s: _f(100 * s["busy"], "{:.1f} %")),
        ("uncached tokens computed in the burst / capacity",
         lambda s: _f(100 * s["prefill_utilisation"], "{:.1f} %")),
        ("light-a share of its fair uncached tokens",
         lambda s: _f(100 * s["fair_share"]["light-a"], "{:.1f} %")),
        ("light-b share of its fair uncached tokens",
         lambda s: _f(100 * s["fair_share"]["light-b"], "{:.1f} %")),
        ("Retry-After p50 / p90 (s)",
         lambda s: f"{_f(s['retry_after_p50'], '{:.0f}')} / {_f(s['retry_after_p90'], '{:.0f}')}"),
    ]
    head = "| | " + " | ".join(f"admission {s['mode']}" for s in sums) + " |"
    lines = [head, "|---|" + "---|" * len(sums)]
    lines += [f"| {name} | " + " | ".join(cell(s) for s in sums) + " |" for name, cell in rows]
    return "\n".join(lines)


def plots(result: dict[str, Any], out_dir: Path, name: str) -> list[str]:
    meta = result["meta"]
    scale = meta["time_scale"]
    lo, hi = meta["calm_s"], meta["calm_s"] + meta["burst_s"]
    runs = result["runs"]
    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 3.2 * len(runs)), sharex=True,
                             squeeze=False)
    for ax, run in zip(axes[:, 0], runs, strict=True):
        for tenant, colour in (("heavy", "tab:red"), ("light-a", "tab:blue"),
                               ("light-b", "tab:green")):
            ok = [r for r in run["records"] if r["tenant"] == tenant and r["status"] == 200
                  and r["first_token_s"] is not None]
            ax.scatter([r["sent_s"] for r in ok],
                       [(r["first_token_s"] - r["sent_s"]) / scale for r in ok],
                       s=4, c=colour, label=f"{tenant} answered")
            shed = [r for r in run["records"] if r["tenant"] == tenant and r["status"] == 429]
            ax.scatter([r["sent_s"] for r in shed], [0.02] * len(shed), s=4, marker="x",
                       c=colour, alpha=0.4)
        ax.axvspan(lo, hi, color="grey", alpha=0.12)
        ax.axhline(meta["max_queue_wait_s"] / scale + meta["own_prefill_s"], ls="--", c="k",
                   lw=0.8, label="wait + own prefill")
        ax.set_yscale("log")
        ax.set_ylabel("TTFT (simulated s)")
        ax.set_title(f"admission {run['mode']}: TTFT by send time (x at bottom: 429)",
                     fontsize=9)
        ax.legend(fontsize=7, loc="upper left")
    axes[-1, 0].set_xlabel("send time (s); grey: the burst")
    fig.tight_layout()
    ttft_png = f"{name}-ttft.png"
    fig.savefig(out_dir / ttft_png, dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 3.0 * len(runs)), sharex=True,
                             squeeze=False)
    end = max(r["end_s"] or 0 for run in runs for r in run["records"])
    edges = np.arange(0, end + 5, 5.0)
    for ax, run in zip(axes[:, 0], runs, strict=True):
        for tenant in ("heavy", *LIGHT):
            ok = [r for r in run["records"] if r["tenant"] == tenant and r["status"] == 200
                  and r["first_token_s"] is not None]
            hist, _ = np.histogram([r["first_token_s"] for r in ok], bins=edges,
                                   weights=[_uncached(r) for r in ok])
            ax.plot(edges[:-1] + 2.5, hist / 5.0 / 1000.0, label=tenant)
        ax.axvspan(lo, hi, color="grey", alpha=0.12)
        ax.set_ylabel("k uncached tokens/s")
        ax.set_title(f"admission {run['mode']}: uncached tokens served per tenant", fontsize=9)
        ax.legend(fontsize=7, loc="upper left")
    axes[-1, 0].set_xlabel("wall time (s); grey: the burst")
    fig.tight_layout()
    share_png = f"{name}-tenants.png"
    fig.savefig(out_dir / share_png, dpi=110)
    plt.close(fig)
    return [ttft_png, share_png]


def report(result: dict[str, Any], out_dir: Path, name: str) -> str:
    meta = result["meta"]
    sums = [summarize(meta, run) for run in result["runs"]]
    result["summary"] = sums
    pngs = plots(result, out_dir, name)
    lines = [f"`{meta['caption']}`", "",
             f"{meta['workers']} simulated workers ({meta['profile']}, time scale "
             f"{meta['time_scale']:g}), capacity {meta['capacity_rps']:.2f} requests/s "
             f"({meta['capacity_tokens_s']:.0f} uncached tokens/s, roofline); "
             f"{meta['calm']:g}x for {meta['calm_s']:g} s, {meta['burst']:g}x for "
             f"{meta['burst_s']:g} s, {meta['calm']:g}x for {meta['calm_s']:g} s; tenants "
             f"heavy : light-a : light-b = {meta['heavy']:g} : 1 : 1; admission on: "
             f"--max-queue-wait-s {meta['max_queue_wait_s']:g} --engine-queue-s "
             f"{meta['engine_queue_s']:g}; client timeout {meta['client_timeout_s']:g} s; "
             f"own prefill of a request {meta['own_prefill_s']:.3f} s.", "",
             table(meta, sums), ""]
    lines += [f"![{p}](results/{p})" for p in pngs]
    return "\n".join(lines) + "\n"
