"""Read what the launcher needs from vLLM's Prometheus /metrics text.

vLLM publishes no API for its KV capacity, but its `vllm:cache_config_info` info-gauge
carries every CacheConfig field as a label, `num_gpu_blocks` included (also on CPU, where it
counts the blocks in VLLM_CPU_KVCACHE_SPACE). In-flight work for draining is
`vllm:num_requests_running` + `vllm:num_requests_waiting`. With data parallelism each engine
reports its own series (label `engine`), so both are summed over engines.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

CACHE_INFO = "vllm:cache_config_info"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"


@dataclass(frozen=True)
class EngineStats:
    """One scrape: KV capacity (None until vLLM has profiled memory) and in-flight requests."""

    capacity_blocks: int | None
    block_size: int | None
    running: int
    waiting: int

    @property
    def in_flight(self) -> int:
        return self.running + self.waiting


def parse(text: str) -> EngineStats:
    capacity: dict[str, int] = {}
    block_size: int | None = None
    running = waiting = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == CACHE_INFO:
                blocks = sample.labels.get("num_gpu_blocks", "None")
                if blocks.isdigit():
                    capacity[sample.labels.get("engine", "")] = int(blocks)
                size = sample.labels.get("block_size", "None")
                if size.isdigit():
                    block_size = int(size)
            elif sample.name == RUNNING:
                running += sample.value
            elif sample.name == WAITING:
                waiting += sample.value
    return EngineStats(
        capacity_blocks=sum(capacity.values()) if capacity else None,
        block_size=block_size,
        running=int(running),
        waiting=int(waiting),
    )
