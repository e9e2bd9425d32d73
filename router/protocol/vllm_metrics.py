"""The one reader of vLLM's Prometheus /metrics text, for the router and the workers.

What is read: ``vllm:num_requests_running`` and ``vllm:num_requests_waiting`` (summed over
label sets: a data-parallel worker reports one series per engine), KV-cache usage
(``vllm:kv_cache_usage_perc``, or the older ``vllm:gpu_cache_usage_perc``; averaged over
engines), and the KV capacity from the ``vllm:cache_config_info`` info-gauge, which
carries every CacheConfig field as a label (``num_gpu_blocks`` summed over engines; vLLM
publishes no API for it).

Why a line filter rather than ``prometheus_client.parser``: a router scrapes every worker
about once a second, and a vLLM page is mostly histograms it does not need. Measured on
the simulator's 8 KB page (``python -m bench.metrics_parse``, bench/results/
metrics-parse.md): 22 µs per page against the parser's 1,001 µs, i.e. 2 % of a core
against all of it at 1,000 workers scraped every second. NaN and Inf are skipped.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

RUNNING, WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
CACHE_INFO = "vllm:cache_config_info"
_WANTED = (RUNNING, WAITING, CACHE_INFO, *KV_USAGE)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


@dataclass(frozen=True, slots=True)
class EngineStats:
    """One scrape. ``capacity_blocks`` is None until vLLM has profiled memory."""

    capacity_blocks: int | None
    block_size: int | None
    running: int
    waiting: int
    kv_usage: float = 0.0
    has_queue: bool = True  # False when the page had neither running nor waiting

    @property
    def in_flight(self) -> int:
        return self.running + self.waiting


def parse(text: str) -> EngineStats:
    counts = {RUNNING: 0.0, WAITING: 0.0}
    capacity: dict[str, int] = {}
    block_size: int | None = None
    usage, ranks, has_queue = 0.0, 0, False
    for line in text.splitlines():
        if not line.startswith(_WANTED):
            continue
        brace = line.find("{")
        name = line[:brace] if brace >= 0 else line.split(" ", 1)[0]
        if name == CACHE_INFO:
            labels = dict(_LABEL.findall(line[brace:line.rfind("}")]))
            blocks, size = labels.get("num_gpu_blocks", ""), labels.get("block_size", "")
            if blocks.isdigit():
                capacity[labels.get("engine", "")] = int(blocks)
            if size.isdigit():
                block_size = int(size)
            continue
        try:
            value = float(line.rsplit(" ", 1)[1])
        except (IndexError, ValueError):
            continue
        if not math.isfinite(value):
            continue
        if name in counts:
            counts[name] += value
            has_queue = True
        elif name in KV_USAGE:
            usage += value
            ranks += 1
    return EngineStats(capacity_blocks=sum(capacity.values()) if capacity else None,
                       block_size=block_size, running=round(counts[RUNNING]),
                       waiting=round(counts[WAITING]),
                       kv_usage=usage / ranks if ranks else 0.0, has_queue=has_queue)
