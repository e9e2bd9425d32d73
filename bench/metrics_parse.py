"""``python -m bench.metrics_parse``: the router's vLLM metrics reader against
prometheus_client's own parser, on a real page from the simulated engine.

Why: a router scrapes every worker about once a second; at 1,000 workers that is 1,000
pages a second on the router's event loop. Prints microseconds per page and the share of
one core each would take at 1,000 workers/s.
"""

from __future__ import annotations

import sys
import time
import urllib.request
from pathlib import Path

import orjson
from prometheus_client.parser import text_string_to_metric_families

from bench import fleet
from router.protocol import vllm_metrics

WANTED = {"vllm:num_requests_running", "vllm:num_requests_waiting",
          "vllm:kv_cache_usage_perc", "vllm:cache_config_info"}


def with_prometheus_client(text: str) -> int:
    found = 0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found += sample.name in WANTED
    return found


def per_page_us(parse: object, text: str, seconds: float = 2.0) -> float:
    n, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        parse(text)  # type: ignore[operator]
        n += 1
    return (time.perf_counter() - started) / n * 1e6


def main() -> None:
    logdir = Path("/tmp/prefix-router-bench/metrics-parse")
    (worker,) = fleet.start_workers(1, fleet.WorkerSpec(), logdir)
    try:
        body = {"model": fleet.MODEL, "prompt": "a b c " * 300, "max_tokens": 8}
        for _ in range(5):  # a few answers, so the histograms have buckets filled
            req = urllib.request.Request(worker.url + "/v1/completions", orjson.dumps(body),
                                         {"Content-Type": "application/json"})
            urllib.request.urlopen(req, timeout=30).read()
        text = urllib.request.urlopen(worker.url + "/metrics", timeout=10).read().decode()
    finally:
        worker.stop()
    ours = per_page_us(vllm_metrics.parse, text)
    theirs = per_page_us(with_prometheus_client, text)
    lines = [f"`python -m bench.metrics_parse` (page: {len(text):,} bytes, "
             f"{text.count(chr(10)):,} lines from the simulator)", "",
             "| reader | µs per page | core share at 1,000 workers/s |", "|---|---|---|",
             f"| router/protocol/vllm_metrics.parse (line filter) | {ours:.0f} | "
             f"{ours / 1e3:.1%} |",
             f"| prometheus_client.parser | {theirs:.0f} | {theirs / 1e3:.1%} |"]
    out = Path(__file__).resolve().parent / "results" / "metrics-parse.md"
    out.write_text("\n".join(lines) + "\n")
    sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
