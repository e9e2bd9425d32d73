"""``python -m bench.paired NAME [BASE]``: every policy's first token against BASE's, by request.

A comparison replays the same requests under every policy, so a request's time to first
token under two paths can be paired by its index. The median of the differences is what the
path itself adds to a request (an Envoy + picker hop against the proxy, say) with the
placement noise of the tail left out; the median over requests that found the same cached
tokens both ways also leaves out the requests the two runs placed differently.

Then, against the policy with the lowest median, which requests decide BASE's median: those
that BASE puts above that policy's median while it puts them below, and the other way
round, by BASE's reason for the placement and by the cached tokens each found (more, the
same, or fewer by over ``SAME_CACHE_TOKENS``). Equal counts each way leave the medians equal;
a surplus of one kind says what costs or wins the median.
"""

from __future__ import annotations

import statistics
import sys
from collections import Counter
from typing import Any

from bench.spread import load

BASE = "predicted_ttft"
SAME_CACHE_TOKENS = 256  # engines report cached tokens in whole blocks: a few blocks either
# way is the same prefix found, not another placement


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


def outside(base: list[dict[str, Any]], other: list[dict[str, Any]]) -> float:
    """The median difference, by request, of the time outside the engine's HTTP server
    (the client's first token less the server's own, receipt to first token out): the
    router's whole hop, its decision and a held stream's wait included, without the
    engine's queue and prefill that placement decides. In ms; NaN without server times."""
    ok = {r["index"]: r for r in base if r["status"] == "ok" and r.get("server_ttft_ms")}
    diffs = [(_ttft_ms(r) - r["server_ttft_ms"]) - (_ttft_ms(mine) - mine["server_ttft_ms"])
             for r in other if r["status"] == "ok" and r.get("server_ttft_ms")
             and (mine := ok.get(r["index"])) is not None]
    return statistics.median(diffs) if diffs else float("nan")


def _cache(mine: dict[str, Any], other: dict[str, Any]) -> str:
    diff = mine["cached_tokens"] - other["cached_tokens"]
    if diff > SAME_CACHE_TOKENS:
        return "more cached"
    return "fewer cached" if diff < -SAME_CACHE_TOKENS else "same cached"


def crossings(base: list[dict[str, Any]], other: list[dict[str, Any]]
              ) -> tuple[float, Counter[tuple[str, str]], Counter[tuple[str, str]]]:
    """(other's median in ms, requests base puts above it and other below, the reverse):
    each counted by base's reason and by the cached tokens base found against other's."""
    ok = {r["index"]: r for r in base if r["status"] == "ok"}
    theirs = [r for r in other if r["status"] == "ok" and r["index"] in ok]
    median = statistics.median(_ttft_ms(r) for r in theirs)
    above: Counter[tuple[str, str]] = Counter()
    below: Counter[tuple[str, str]] = Counter()
    for record in theirs:
        mine = ok[record["index"]]
        tag = (mine.get("reason") or "-", _cache(mine, record))
        if _ttft_ms(mine) > median >= _ttft_ms(record):
            above[tag] += 1
        elif _ttft_ms(record) > median >= _ttft_ms(mine):
            below[tag] += 1
    return median, above, below


def _tags(counts: Counter[tuple[str, str]]) -> str:
    return ", ".join(f"{reason}/{cache} {n}" for (reason, cache), n in counts.most_common(6))


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
            hop = outside(runs[base]["records"], run["records"])
            print(f"  {policy}: median {every:+.2f}, same cached tokens {same:+.2f}, outside "
                  f"the engine's server {hop:+.2f} ({n} requests)")
    rivals = {p: statistics.median(_ttft_ms(r) for r in run["records"] if r["status"] == "ok")
              for p, run in runs.items() if p != base}
    rival = min(rivals, key=rivals.__getitem__)
    median, above, below = crossings(runs[base]["records"], runs[rival]["records"])
    print(f"across {rival}'s median ({median:.1f} ms), by {base}'s reason / cached tokens:")
    print(f"  {base} above, {rival} below: {sum(above.values())} ({_tags(above)})")
    print(f"  {base} below, {rival} above: {sum(below.values())} ({_tags(below)})")


if __name__ == "__main__":
    main(sys.argv[1:])
