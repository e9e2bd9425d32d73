"""The simulated engine's settings (vLLM's flags of the same names) and running totals."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineConfig:
    model_name: str = "sim-model"
    block_size: int = 16
    num_gpu_blocks: int | None = None       # None: derived from the profile
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None        # None: the profile's
    preemption_mode: str = "recompute"      # or "swap"
    enable_prefix_caching: bool = True
    # "paged" (vLLM), or "contiguous": one run of blocks reserved per request when it
    # starts (the pre-paging baseline bench/engine measures); contiguous shares nothing.
    kv_allocation: str = "paged"
    # contiguous only: reserve max_model_len ("max", Orca-Max) or the request's own
    # prompt + max_tokens ("request", Orca-Oracle) tokens
    contiguous_reserve: str = "max"
    cpu_offload_gb: float = 0.0
    hash_algo: str = "sha256_cbor"
    hash_seed: str | None = None            # None: PYTHONHASHSEED, else random (as vLLM)
    seed: int = 0


@dataclass
class EngineCounters:
    """Running totals, for in-process users (the same numbers /metrics exposes)."""

    prefix_queries: int = 0
    prefix_hits: int = 0
    external_hits: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    preempted_tokens: int = 0  # KV tokens the preempted sequences held
    finished: int = 0
    steps: int = 0
