"""``python -m bench.spread NAME-1 NAME-2 ...``: one table of several runs of a comparison.

Each cell is the runs' values side by side (``a / b``), so the run-to-run spread is read
off the table itself; the last columns check issue 11's acceptance for the first policy
(default: predicted_ttft) against the best other policy, run by run, in client-side TTFT
and in the engines' own TTFT (which excludes a bench-side shim's cost, as Dynamo's).

Each ratio comes with a 95 % interval: the requests resampled with replacement, the same
request indices for both policies (every policy replays one sequence). A p99 over 1,200
requests is the 12th slowest, so a ratio of 1.01 may be a difference the run cannot
tell from none; an interval that holds 1.00 says so. With two runs or more, a last line
pools their requests (each run resampled within itself) against the policy best in the pool:
the same code measured four times tells a p50 apart twice as finely as once.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from bench.analysis import engine_ttft

RESULTS = Path(__file__).resolve().parent / "results"
CANDIDATE = "predicted_ttft"


def load(name: str) -> dict[str, dict[str, Any]]:
    out = {}
    for path in sorted(RESULTS.glob(f"{name}-*.json")):
        policy = path.stem[len(name) + 1:]
        if policy in ("summary",):
            continue
        out[policy] = orjson.loads(path.read_bytes())
    return out


def per_request(result: dict[str, Any], engine: bool) -> dict[int, float]:
    """Request index -> TTFT in ms (the client's, or the engine's own) of the served ones."""
    scale = 1000.0 / result["meta"].get("time_scale", 1.0)
    out = {}
    for r in result["records"]:
        if r["status"] != "ok":
            continue
        if engine:
            if r.get("engine_ttft_ms") is not None:
                out[r["index"]] = r["engine_ttft_ms"]
        elif r.get("first_token_s") is not None:
            out[r["index"]] = (r["first_token_s"] - r["sent_s"]) * scale
    return out


def ratio_interval(mine: dict[int, float], other: dict[int, float], q: float,
                   draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95 % interval of the ``q`` quantile's ratio, mine over other, over the requests both
    served, resampled in pairs: one run pooled alone."""
    _, low, high = pooled_interval([(mine, other)], q, draws, seed)
    return low, high


def pooled_interval(pairs: list[tuple[dict[int, float], dict[int, float]]], q: float,
                    draws: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """(ratio, 95 % low, high) of the ``q`` quantile over several runs' requests pooled,
    mine over other. Each run's requests are resampled in pairs within that run: runs of
    one comparison differ by the machine's state, so a draw keeps each run's share. One
    RAG run (1,200 requests) tells a p50 apart by about +-4 %, four pooled by about +-2 %."""
    rng = np.random.default_rng(seed)
    runs = []
    for mine, other in pairs:
        common = sorted(mine.keys() & other.keys())
        runs.append((np.fromiter((mine[i] for i in common), float, len(common)),
                     np.fromiter((other[i] for i in common), float, len(common))))
    a = np.concatenate([m for m, _ in runs])
    b = np.concatenate([o for _, o in runs])
    picks = [rng.integers(0, len(m), (draws, len(m))) for m, _ in runs]
    a_draws = np.concatenate([m[k] for (m, _), k in zip(runs, picks, strict=True)], axis=1)
    b_draws = np.concatenate([o[k] for (_, o), k in zip(runs, picks, strict=True)], axis=1)
    ratios = (np.percentile(a_draws, 100 * q, axis=1)
              / np.percentile(b_draws, 100 * q, axis=1))
    low, high = np.percentile(ratios, [2.5, 97.5])
    return (float(np.percentile(a, 100 * q) / np.percentile(b, 100 * q)), float(low),
            float(high))


def _pooled_line(runs: list[dict[str, dict[str, Any]]]) -> str:
    """The acceptance ratios over every run's requests together, against the policy best in
    that pool at each percentile."""
    others = [p for p in runs[0] if p != CANDIDATE and all(p in r for r in runs)]
    cells = []
    for engine in (False, True):
        mine = [per_request(r[CANDIDATE], engine) for r in runs]
        if not all(mine):
            continue  # a run without these figures (engine TTFTs before a90036d)
        theirs = {p: [per_request(r[p], engine) for r in runs] for p in others}
        pools = {p: np.fromiter((v for run in ts for v in run.values()), float)
                 for p, ts in theirs.items() if all(ts)}
        if not pools:
            continue
        for q in (0.5, 0.9, 0.99):
            best = min(pools, key=lambda p: np.percentile(pools[p], 100 * q))
            ratio, low, high = pooled_interval(list(zip(mine, theirs[best], strict=True)), q)
            cells.append(f"{'engine ' if engine else ''}p{round(q * 100)} {ratio:.3f} "
                         f"[{low:.2f}-{high:.2f}] (best other: {best})")
    return f"- all {len(runs)} runs pooled: " + "; ".join(cells)


def _fmt(values: list[float | None], spec: str, scale: float = 1.0) -> str:
    return " / ".join("–" if v is None else format(v * scale, spec) for v in values)


def table(names: list[str]) -> str:
    runs = [load(n) for n in names]
    policies = [p for p in runs[0] if all(p in r for r in runs)]
    policies.sort(key=lambda p: (p != CANDIDATE, p))
    lines = [f"runs: {', '.join(names)} (each cell: run 1 / run 2 ...)", "",
             "| policy | hit rate % | % of fleet-LRU bound | TTFT p50 | TTFT p90 | TTFT p99 | "
             "engine TTFT p50 | engine p90 | engine p99 | engine server p50 | hop p50 | "
             "max/mean busy | max/mean req |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in policies:
        rs = [r[p] for r in runs]
        lines.append("| " + " | ".join([
            p, _fmt([x["hit_rate"] for x in rs], ".1f", 100),
            _fmt([x["hit_rate"] / x["bounds"]["fleet_lru_hit_rate"] for x in rs], ".0f", 100),
            *(_fmt([x["ttft_ms"][q] for x in rs], ".0f") for q in ("p50", "p90", "p99")),
            *(_fmt([engine_ttft(x)[q] for x in rs], ".0f") for q in ("p50", "p90", "p99")),
            _fmt([(x.get("engine_server_ms") or {}).get("p50") for x in rs], ".1f"),
            _fmt([(x.get("hop_ms") or {}).get("p50") for x in rs], ".1f"),
            _fmt([x["load"]["busy_max_over_mean"] for x in rs], ".2f"),
            _fmt([x["load"]["requests_max_over_mean"] for x in rs], ".2f")]) + " |")
    lines += ["", "Acceptance for `predicted_ttft`, run by run (ratio to the best other policy "
              "at each percentile, [its 95 % interval over the requests]; <= 1.00 meets it):",
              ""]
    for name, r in zip(names, runs, strict=True):
        if CANDIDATE not in r:
            continue
        me, others = r[CANDIDATE], {p: x for p, x in r.items() if p != CANDIDATE}
        cells = []
        for engine in (False, True):
            figures = engine_ttft if engine else (lambda x: x["ttft_ms"])
            mine = per_request(me, engine)
            for q in ("p50", "p90", "p99"):
                vals = {p: figures(x)[q] for p, x in others.items() if figures(x)[q] is not None}
                best = min(vals, key=vals.get)  # type: ignore[arg-type]
                low, high = ratio_interval(mine, per_request(others[best], engine),
                                           int(q[1:]) / 100)
                cells.append(f"{'engine ' if engine else ''}{q} "
                             f"{figures(me)[q] / vals[best]:.3f} [{low:.2f}-{high:.2f}] "
                             f"(best other: {best})")
        bound = me["bounds"]["fleet_lru_hit_rate"]
        cells.append(f"hit rate {me['hit_rate'] / bound:.1%} of the bound")
        busy = me["load"]["busy_max_over_mean"]
        cells.append(f"max/mean busy {busy:.2f}" if busy is not None else "busy n/a")
        lines.append(f"- {name}: " + "; ".join(cells))
    with_candidate = [r for r in runs if CANDIDATE in r]
    if len(with_candidate) >= 2:
        lines.append(_pooled_line(with_candidate))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(table(sys.argv[1:]))
