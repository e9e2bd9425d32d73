"""bench.wait: an engine TTFT split into the prompt's own prefill on an idle engine and
the wait, checked against the simulated engine itself."""

from __future__ import annotations

from bench.wait import floor_ms, split
from engine_worker.sim import Engine, EngineConfig, VirtualClock
from engine_worker.sim.profiles import load_profile

PROFILE = load_profile("llama-3-8b@h100-80gb")


async def test_the_floor_is_an_idle_engines_ttft_over_several_prefill_chunks() -> None:
    engine = Engine(PROFILE, EngineConfig(hash_seed="0", max_model_len=32768), VirtualClock())
    doc = list(range(1, 6001))
    _, cold = await engine.generate([*doc, *range(7001, 20001)], max_tokens=1)  # 3 chunks
    _, warm = await engine.generate([*doc, *range(30001, 31001)], max_tokens=1)
    await engine.stop()
    assert cold.cached_tokens == 0 and warm.cached_tokens == 6000
    assert abs(floor_ms(PROFILE, 19000, 0) - cold.ttft * 1000) < 1e-6
    assert abs(floor_ms(PROFILE, 7000, 6000) - warm.ttft * 1000) < 1e-6


def test_the_wait_is_the_rest_of_the_engine_ttft_and_failures_are_left_out() -> None:
    floor = floor_ms(PROFILE, 4000, 1000)
    records = [
        {"status": "ok", "reason": "warm", "prompt_tokens": 4000, "cached_tokens": 1000,
         "engine_ttft_ms": floor + 25.0},
        {"status": "error", "reason": "cold", "prompt_tokens": 4000, "cached_tokens": 0,
         "engine_ttft_ms": None},
    ]
    [(reason, got_floor, wait)] = split(records, PROFILE)
    assert reason == "warm" and got_floor == floor and abs(wait - 25.0) < 1e-9
