"""A vLLM-compatible simulated engine: the router's test fleet, bench fleet and load target.

In-process use (no HTTP)::

    from engine_worker.sim import Engine, EngineConfig, VirtualClock
    engine = Engine("llama-3-8b@h100-80gb", EngineConfig(), VirtualClock())
    events, stats = await engine.generate(token_ids, max_tokens=16)
"""

from engine_worker.sim.clock import ScaledClock, VirtualClock
from engine_worker.sim.engine import Engine
from engine_worker.sim.engine_config import EngineConfig, EngineCounters
from engine_worker.sim.profiles import Profile, load_profile
from engine_worker.sim.request import RequestHandle, RequestStats, TokenEvent

__all__ = ["Engine", "EngineConfig", "EngineCounters", "Profile", "RequestHandle",
           "RequestStats", "ScaledClock", "TokenEvent", "VirtualClock", "load_profile"]
