"""Step times from a roofline model: a step costs max(FLOPs / compute, bytes / bandwidth).

Prefill is compute-bound (2 x params FLOPs per token plus attention over the context);
decode is bandwidth-bound (all weights plus every running sequence's KV read once per
step). Transfers between GPU and CPU memory (swap, CPU-tier loads) go over PCIe and are
added serially, as vLLM does not overlap them with compute in the simple path. A swap
also pays a fixed cost per copy (one per block, layer and K/V: profiles.yaml,
``swap_copy_overhead_us``), which is what makes small blocks expensive to swap.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine_worker.sim.profiles import Profile


def attention_flops(profile: Profile, new_tokens: int, context_before: int) -> float:
    """QK^T and AV for ``new_tokens`` queries over ``context_before`` + causal new keys:
    4 x layers x (heads x head_dim) FLOPs per query-key pair."""
    m = profile.model
    pairs = new_tokens * context_before + new_tokens * (new_tokens + 1) / 2
    return 4.0 * m.layers * m.heads * m.head_dim * pairs


@dataclass
class StepCost:
    """Work of one engine step, accumulated as the scheduler builds the batch."""

    flops: float = 0.0
    kv_read_bytes: float = 0.0
    pcie_bytes: float = 0.0
    pcie_copies: int = 0
    tokens: int = 0
    parts: list[str] = field(default_factory=list)

    def add_tokens(self, profile: Profile, new_tokens: int, context_before: int) -> None:
        self.flops += 2.0 * profile.model.params * new_tokens
        self.flops += attention_flops(profile, new_tokens, context_before)
        self.kv_read_bytes += context_before * profile.model.kv_bytes_per_token
        self.tokens += new_tokens

    def add_transfer(self, profile: Profile, num_tokens: int) -> None:
        self.pcie_bytes += num_tokens * profile.model.kv_bytes_per_token

    def add_swap(self, profile: Profile, num_tokens: int, block_size: int) -> None:
        """A swap out or in: the bytes, and one copy per block, per layer, for K and V."""
        self.add_transfer(profile, num_tokens)
        self.pcie_copies += 2 * profile.model.layers * -(-num_tokens // block_size)


def step_seconds(profile: Profile, cost: StepCost) -> float:
    """Simulated seconds of one step (0 when nothing was scheduled)."""
    if cost.tokens == 0 and cost.pcie_bytes == 0:
        return 0.0
    gpu, eff = profile.gpu, profile.eff
    compute = cost.flops / (gpu.bf16_tflops * 1e12 * eff.compute)
    memory = (profile.model.weight_bytes + cost.kv_read_bytes) / (gpu.hbm_gbps * 1e9 * eff.memory)
    transfer = (cost.pcie_bytes / (gpu.pcie_gbps * 1e9 * eff.pcie)
                + cost.pcie_copies * eff.swap_copy_overhead_us / 1e6)
    busy = max(compute, memory) if cost.tokens else 0.0
    return busy + transfer + eff.step_overhead_ms / 1000.0


def prefill_seconds(profile: Profile, num_tokens: int, cached_tokens: int = 0) -> float:
    """One-step prefill of a single prompt (what TTFT is on an idle engine)."""
    cost = StepCost()
    cost.add_tokens(profile, num_tokens - cached_tokens, cached_tokens)
    return step_seconds(profile, cost)
