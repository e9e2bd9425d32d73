"""PNG plots of a comparison: TTFT CDF, hit rate and p99 TTFT, per-worker load."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np


def _wrap(caption: str, width: int = 130) -> str:
    return "\n".join(textwrap.wrap(caption, width))


def _ttfts(result: dict[str, Any]) -> np.ndarray:
    scale = result["meta"]["time_scale"]
    vals = [(r["first_token_s"] - r["sent_s"]) * 1000.0 / scale for r in result["records"]
            if r["status"] == "ok" and r["first_token_s"] is not None]
    return np.sort(np.asarray(vals, dtype=float))


def ttft_cdf(results: Sequence[dict[str, Any]], path: Path, caption: str) -> None:
    fig, ax = plt.subplots(figsize=(8, 5))
    for res in results:
        v = _ttfts(res)
        if len(v):
            ax.plot(v, np.arange(1, len(v) + 1) / len(v), label=res["meta"]["label"])
    ax.set_xscale("log")
    ax.set_xlabel("time to first token (simulated ms, client-side, log scale)")
    ax.set_ylabel("fraction of requests")
    ax.set_title("TTFT CDF per policy\n" + _wrap(caption), fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def hit_rate_p99(results: Sequence[dict[str, Any]], path: Path, caption: str) -> None:
    labels = [r["meta"]["label"] for r in results]
    hits = [100 * (r["hit_rate"] or 0) for r in results]
    p99 = [r["ttft_ms"]["p99"] or 0 for r in results]
    x = np.arange(len(labels))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 5))
    a1.bar(x, hits, color="tab:blue", label="fleet hit rate (workers' counters)")
    b = results[0].get("bounds") or {}
    if b:
        a1.axhline(100 * b["unbounded_hit_rate"], color="k", ls="--",
                   label="upper bound: one unbounded cache")
        a1.axhline(100 * b["fleet_lru_hit_rate"], color="tab:red", ls=":",
                   label="upper bound: one LRU of the fleet's size")
    top = max([*hits, 100 * b.get("unbounded_hit_rate", 0), 1.0])
    a1.set_ylim(0, top * 1.45)  # room for the legend above the bars
    a1.set_ylabel("prefix cache hit rate (% of prompt tokens)")
    a1.set_title("Fleet prefix hit rate per policy")
    a2.bar(x, p99, color="tab:orange", label="p99 TTFT (client-side)")
    rr = next((r["ttft_ms"]["p99"] for r in results if r["meta"]["policy"] == "round_robin"), None)
    if rr:
        a2.axhline(rr, color="k", ls="--", label="round_robin's p99")
    a2.set_yscale("log")
    a2.set_ylim(min([v for v in p99 if v > 0] or [1]) / 2, max([*p99, 1]) * 4)
    a2.set_ylabel("p99 time to first token (simulated ms, log scale)")
    a2.set_title("p99 TTFT per policy (client-side)")
    for ax, vals, fmt in ((a1, hits, "{:.1f}"), (a2, p99, "{:.0f}")):
        for xi, v in zip(x, vals, strict=True):
            ax.annotate(fmt.format(v), (xi, v), ha="center", va="bottom", fontsize=7,
                        xytext=(0, 2), textcoords="offset points")
    for ax in (a1, a2):
        ax.set_xticks(x, labels, rotation=30, ha="right", fontsize=8)
        ax.set_xlabel("policy")
        ax.legend(fontsize=8, loc="upper left")
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(_wrap(caption, 180), fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def worker_load(results: Sequence[dict[str, Any]], path: Path, caption: str) -> None:
    fig, ax = plt.subplots(figsize=(10, 5))
    n = max(len(r["workers"]) for r in results)
    width = 0.8 / max(1, len(results))
    for i, res in enumerate(results):
        reqs = [w["requests"] for w in res["workers"]]
        ax.bar(np.arange(len(reqs)) + i * width, reqs, width, label=res["meta"]["label"])
    ax.set_xticks(np.arange(n) + 0.4 - width / 2, [f"worker {i}" for i in range(n)])
    ax.set_xlabel("worker")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.3)  # room for the legend
    ax.set_ylabel("requests served (count, from the workers' counters)")
    ax.set_title("Per-worker load per policy\n" + _wrap(caption), fontsize=7)
    ax.legend(fontsize=8, ncol=4, loc="upper left")
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
