"""Model and GPU profiles (data in profiles.yaml) and the numbers derived from them."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

_PROFILES = Path(__file__).with_name("profiles.yaml")


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    params: float
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    bytes_per_elt: int
    vocab: int
    max_model_len: int

    @property
    def weight_bytes(self) -> float:
        return self.params * self.bytes_per_elt

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V for every layer: 2 x layers x kv_heads x head_dim x bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_elt


@dataclass(frozen=True, slots=True)
class GpuSpec:
    name: str
    memory_gb: float
    bf16_tflops: float
    hbm_gbps: float
    pcie_gbps: float


@dataclass(frozen=True, slots=True)
class Efficiency:
    compute: float
    memory: float
    pcie: float
    step_overhead_ms: float
    swap_copy_overhead_us: float = 0.0


@dataclass(frozen=True, slots=True)
class Profile:
    """One model on one GPU."""

    model: ModelSpec
    gpu: GpuSpec
    eff: Efficiency

    @property
    def name(self) -> str:
        return f"{self.model.name}@{self.gpu.name}"

    def num_gpu_blocks(self, block_size: int, gpu_memory_utilization: float = 0.9) -> int:
        """Blocks left for KV after weights, as vLLM sizes its cache (activations ignored)."""
        free = self.gpu.memory_gb * 1e9 * gpu_memory_utilization - self.model.weight_bytes
        return max(0, int(free // (block_size * self.model.kv_bytes_per_token)))


@cache
def _raw() -> dict[str, Any]:
    with _PROFILES.open() as fh:
        return yaml.safe_load(fh)


def model_names() -> list[str]:
    return sorted(_raw()["models"])


def gpu_names() -> list[str]:
    return sorted(_raw()["gpus"])


def load_profile(spec: str) -> Profile:
    """Parse ``MODEL@GPU`` (e.g. ``llama-3-8b@h100-80gb``)."""
    model_name, sep, gpu_name = spec.partition("@")
    raw = _raw()
    if not sep or model_name not in raw["models"] or gpu_name not in raw["gpus"]:
        raise ValueError(f"unknown profile {spec!r}: use MODEL@GPU with MODEL in "
                         f"{model_names()} and GPU in {gpu_names()}")
    m = raw["models"][model_name]
    g = raw["gpus"][gpu_name]
    model = ModelSpec(name=model_name, params=float(m["params"]), layers=int(m["layers"]),
                      hidden=int(m["hidden"]), heads=int(m["heads"]),
                      kv_heads=int(m["kv_heads"]), head_dim=int(m["head_dim"]),
                      bytes_per_elt=int(m["bytes_per_elt"]), vocab=int(m["vocab"]),
                      max_model_len=int(m["max_model_len"]))
    gpu = GpuSpec(name=gpu_name, memory_gb=float(g["memory_gb"]),
                  bf16_tflops=float(g["bf16_tflops"]), hbm_gbps=float(g["hbm_gbps"]),
                  pcie_gbps=float(g["pcie_gbps"]))
    e = raw["efficiency"]
    eff = Efficiency(compute=float(e["compute"]), memory=float(e["memory"]),
                     pcie=float(e["pcie"]), step_overhead_ms=float(e["step_overhead_ms"]),
                     swap_copy_overhead_us=float(e.get("swap_copy_overhead_us", 0.0)))
    return Profile(model=model, gpu=gpu, eff=eff)
