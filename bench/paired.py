"""``python -m bench.paired NAME [BASE]``: every policy's first token against BASE's, by request.

A comparison replays the same requests under every policy, so a request's time to first
token under two paths can be paired by its index. The median of the differences is what the
path itself adds to a request (an Envoy + picker hop against the proxy, say) with the
placement noise of the tail left out; the median over requests that found the same cached
tokens both ways also leaves out the requests the two runs placed differently.
"""

from __future__ import annotations

import statistics
import sys
from typing import Any

from bench.spread import load

BASE = "predicted_ttft"


def _ttft_ms(record: dict[str, Any]) -> float:
    return (record["first_token_s"] - record["sent_s"]) * 1000


def paired(base: list[dict[str, Any]], other: list[dict[str, Any]]) -> tuple[float, float, int]:
    """(median difference, median over equally cached requests, requests paired), in ms."""
    ok = {r["index"]: r for r in base if r["status"] == "ok"}
    every, same = [], []
    for record in other:
        mine = ok.get(record["index"])
        if mine is None or record["status"] != "ok":
            continue
        diff = _ttft_ms(record) - _ttft_ms(mine)
        every.append(diff)
        if record["cached_tokens"] == mine["cached_tokens"]:
            same.append(diff)
    if not every:
        return float("nan"), float("nan"), 0
    return statistics.median(every), statistics.median(same or every), len(every)


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit(__doc__)
    name, base = argv[0], argv[1] if len(argv) > 1 else BASE
    runs = load(name)
    if base not in runs:
        raise SystemExit(f"no {name}-{base}.json in bench/results")
    print(f"{name}: first token minus {base}'s, paired by request (ms)")
    for policy, run in runs.items():
        if policy != base:
            every, same, n = paired(runs[base]["records"], run["records"])
            print(f"  {policy}: median {every:+.2f}, same cached tokens {same:+.2f} ({n} requests)")


if __name__ == "__main__":
    main(sys.argv[1:])
