"""The simulated CPU tier publishes its blocks as KV events with medium "CPU"."""

from __future__ import annotations

from engine_worker.sim import Engine, EngineConfig, VirtualClock
from engine_worker.sim.events import BlockRemoved, BlockStored, KVEvent
from engine_worker.sim.profiles import load_profile


async def test_a_block_evicted_from_the_gpu_is_announced_on_the_cpu_tier_and_its_eviction_too(
        ) -> None:
    seen: list[KVEvent] = []
    block_bytes = 16 * load_profile("tiny@l4").model.kv_bytes_per_token  # a 6-block tier:
    engine = Engine("tiny@l4", EngineConfig(num_gpu_blocks=8,
                                            cpu_offload_gb=6 * block_bytes / 1e9),
                    VirtualClock(), kv_listeners=[seen.append])
    assert engine.cpu_tier.capacity_blocks == 6
    try:
        for prompt in range(6):  # each 3 blocks: the 8-block GPU cache must evict
            await engine.generate([prompt * 100 + i for i in range(48)], max_tokens=1)
    finally:
        await engine.stop()
    gpu_removed = [h for e in seen if isinstance(e, BlockRemoved) and e.medium == "GPU"
                   for h in e.block_hashes]
    cpu_stored = [h for e in seen if isinstance(e, BlockStored) and e.medium == "CPU"
                  for h in e.block_hashes]
    cpu_removed = [h for e in seen if isinstance(e, BlockRemoved) and e.medium == "CPU"
                   for h in e.block_hashes]
    assert gpu_removed and set(cpu_stored) <= set(gpu_removed)
    assert set(cpu_stored) == set(gpu_removed)  # every GPU eviction was offloaded
    assert len(cpu_stored) > 6 and len(cpu_removed) == len(cpu_stored) - 6  # LRU of 6
    assert len(engine.cpu_tier) == 6
