"""The latency model reproduces its inputs (computed here independently from the YAML)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import yaml

from engine_worker.sim import Engine, EngineConfig, ScaledClock, VirtualClock
from engine_worker.sim.profiles import load_profile
from engine_worker.sim.roofline import prefill_seconds

YAML = Path(__file__).resolve().parents[2] / "engine_worker" / "sim" / "profiles.yaml"


def test_kv_bytes_per_token_opt13b_at_2048_tokens_is_about_1_6_gb() -> None:
    m = load_profile("opt-13b@a100-40gb").model
    assert 1.6e9 <= m.kv_bytes_per_token * 2048 <= 1.7e9


def independent_prefill(tokens: int) -> float:
    raw = yaml.safe_load(YAML.read_text())
    m, g, e = raw["models"]["llama-3-8b"], raw["gpus"]["h100-80gb"], raw["efficiency"]
    params = float(m["params"])  # YAML 1.1 reads "8.03e9" as a string
    linear = 2 * params * tokens
    attention = 4 * m["layers"] * m["heads"] * m["head_dim"] * tokens * (tokens + 1) / 2
    compute = (linear + attention) / (g["bf16_tflops"] * 1e12 * e["compute"])
    memory = params * m["bytes_per_elt"] / (g["hbm_gbps"] * 1e9 * e["memory"])
    return max(compute, memory) + e["step_overhead_ms"] / 1000


async def test_prefill_of_4096_tokens_matches_the_roofline() -> None:
    expected = independent_prefill(4096)
    profile = load_profile("llama-3-8b@h100-80gb")
    assert abs(prefill_seconds(profile, 4096) - expected) < 1e-12
    engine = Engine(profile, EngineConfig(hash_seed="0"), VirtualClock())
    _, stats = await engine.generate(list(range(1, 4097)), max_tokens=1)
    await engine.stop()
    assert stats.ttft is not None
    assert abs(stats.ttft - expected) < 1e-9


async def test_warm_3000_token_prefix_cuts_ttft_at_least_5x() -> None:
    engine = Engine("llama-3-8b@h100-80gb", EngineConfig(hash_seed="0"), VirtualClock())
    doc = list(range(1, 3001))
    _, cold = await engine.generate([*doc, 5, 6, 7, 8], max_tokens=4)
    _, warm = await engine.generate([*doc, 9, 10, 11, 12], max_tokens=4)
    await engine.stop()
    assert cold.cached_tokens == 0 and warm.cached_tokens == 2992
    assert cold.ttft is not None and warm.ttft is not None
    assert cold.ttft >= 5 * warm.ttft


async def test_preemption_by_recompute_and_swap_finish_every_request() -> None:
    for mode in ("recompute", "swap"):
        cfg = EngineConfig(num_gpu_blocks=12, preemption_mode=mode, hash_seed="0")
        engine = Engine("tiny@l4", cfg, VirtualClock())
        handles = [engine.submit([i + 1] * 40, max_tokens=60) for i in range(4)]
        results = [await h.collect() for h in handles]
        await engine.stop()
        assert [len(r) for r in results] == [60] * 4
        assert engine.counters.preemptions > 0
        assert engine.kv.num_free_blocks == 12


async def test_cpu_tier_serves_evicted_prefix_over_pcie() -> None:
    cfg = EngineConfig(num_gpu_blocks=200, cpu_offload_gb=1.0, hash_seed="0")
    engine = Engine("llama-3-8b@h100-80gb", cfg, VirtualClock())
    doc = list(range(1, 2001))
    _, cold = await engine.generate(doc, max_tokens=1)
    await engine.generate(list(range(5001, 8001)), max_tokens=1)  # evicts doc from GPU
    _, again = await engine.generate(doc, max_tokens=1)
    await engine.stop()
    assert again.gpu_cached_tokens < again.cached_tokens
    assert again.ttft is not None and cold.ttft is not None and again.ttft < cold.ttft


async def test_n_greater_than_one_shares_the_prompt_and_streams_are_deterministic() -> None:
    engine = Engine("tiny@l4", EngineConfig(hash_seed="0", seed=3), VirtualClock())
    events, stats = await engine.generate(list(range(1, 50)), max_tokens=5, n=3)
    again, _ = await engine.generate(list(range(1, 50)), max_tokens=5, n=3)
    await engine.stop()
    assert sorted(e.index for e in events) == [0] * 5 + [1] * 5 + [2] * 5
    assert stats.completion_tokens == 15
    key = sorted((e.index, e.token_id) for e in events)
    assert key == sorted((e.index, e.token_id) for e in again)


async def test_first_request_after_start_has_a_positive_ttft() -> None:
    """The engine loop catches up with a clock that ran before the first request."""
    clock = ScaledClock(time_scale=0.001)
    await asyncio.sleep(0.05)  # 50 simulated seconds pass before anything is submitted
    engine = Engine("llama-3-8b@h100-80gb", EngineConfig(), clock=clock)
    _, stats = await engine.generate(list(range(200)), max_tokens=2)
    await engine.stop()
    assert stats.ttft > 0
    assert stats.e2e >= stats.ttft


async def test_a_request_arriving_mid_step_is_stamped_when_it_arrived() -> None:
    """vLLM stamps a request at receipt: one arriving during a step waits for it, and the
    engine's TTFT must count that wait, not the part of the step run before it came."""
    clock = VirtualClock()
    engine = Engine(load_profile("llama-3-8b@h100-80gb"), EngineConfig(hash_seed="0"), clock)
    first = engine.submit(list(range(1, 6001)), max_tokens=1)
    await asyncio.sleep(0)  # the loop starts its first step: a virtual sleep, then a yield
    arrived = clock.now()
    assert arrived > 0.0  # inside that step
    second = engine.submit(list(range(7001, 7017)), max_tokens=1)
    await first.collect()
    await second.collect()
    await engine.stop()
    assert first.stats.arrival == 0.0
    assert second.stats.arrival == arrived > 0.0  # not the step's start
    assert second.stats.first_token > arrived


async def test_a_late_loop_catches_up_with_the_model() -> None:
    """An engine whose loop wakes late (a busy CPU) runs its next steps at once until it
    is back on its model's clock; the model's times do not change. Sleeping a whole step
    from each late wake-up kept the simulated engines behind their model for as long as
    they stayed busy."""
    async def run(stall_s: float) -> tuple[float, float, float]:
        clock = VirtualClock()
        engine = Engine("llama-3-8b@h100-80gb", EngineConfig(hash_seed="0"), clock)
        handle = engine.submit(list(range(1, 2001)), max_tokens=40)
        events = aiter(handle)
        await anext(events)  # the first token
        clock.advance(stall_s)  # the host kept the loop from running for stall_s
        async for _ in events:
            pass
        await engine.stop()
        return handle.stats.ttft, handle.stats.e2e, clock.now()

    ttft, e2e, end = await run(0.0)
    assert e2e > ttft > 0 and end == e2e
    stalled = await run(1.0)
    assert stalled[:2] == (ttft, e2e)  # the model's figures
    # the steps left ran while the clock stood past their ends: the engine is back on
    # its model once the stall is over, not 1 s behind it for the rest of the request
    assert ttft + 1.0 <= stalled[2] < e2e + 1.0


async def test_a_request_the_busy_loop_saw_late_joins_no_step_begun_before_it_arrived() -> None:
    """The loop ran late behind a decode (its host busy, here parsing the next prompt):
    the request it then finds waiting arrived after the step in progress had ended on the
    model's clock, so it waits for a step that starts after its arrival. Stamped at that
    step's end, its prefill was computed before it had reached the engine."""
    profile = load_profile("llama-3-8b@h100-80gb")
    clock = VirtualClock()
    engine = Engine(profile, EngineConfig(hash_seed="0"), clock)
    decode = engine.submit(list(range(1, 65)), max_tokens=200)
    events = aiter(decode)
    await anext(events)  # the first token; the decode runs on
    clock.advance(0.5)  # the host kept the loop from running for half a simulated second
    arrived = clock.now()
    late = engine.submit(list(range(1001, 3001)), max_tokens=1)
    await late.collect()
    async for _ in events:
        pass
    await engine.stop()
    assert late.stats.arrival == arrived
    assert late.stats.ttft is not None and late.stats.ttft >= prefill_seconds(profile, 2000)


async def test_an_idle_engine_starts_on_the_arrival_not_on_its_loops_late_wake_up() -> None:
    """An idle engine's loop woken late (a busy host) does not charge that delay to the
    model: the request's TTFT is its prefill, as when the loop woke at once."""
    profile = load_profile("llama-3-8b@h100-80gb")
    clock = VirtualClock()
    engine = Engine(profile, EngineConfig(hash_seed="0"), clock)
    await engine.generate(list(range(1, 65)), max_tokens=2)  # the loop now waits, idle
    await asyncio.sleep(0)
    idle = engine.submit(list(range(1001, 3001)), max_tokens=1)
    clock.advance(0.5)  # before the loop wakes
    await idle.collect()
    await engine.stop()
    assert idle.stats.ttft == prefill_seconds(profile, 2000)
