"""Agentic: coding/tool agents, a long shared tool prompt and fast-growing histories.

What agents send through a gateway differs from chat in three ways that matter to a
prefix cache and to a router:

- every request starts with a long tool-and-system prompt (~4,000 tokens of tool schemas
  and instructions), the same for every session of one agent "persona" (1-3 personas,
  Zipf-picked, each with its own prompt);
- a session's history grows by a long tool result (200-2,000 tokens: a file, a test log,
  search hits) plus the agent's short previous action (30-200 tokens: the tool call it
  kept) at each of its 3-20 steps, so most of a request is the previous request of the
  same session, and a policy that keeps a session on one worker re-prefills only the new
  step, while one that scatters it re-prefills the whole history;
- arrivals are bursty and machine-paced: sessions start in bursts (compound Poisson: a
  CI run or a parent agent starts several at once), and a session's next step follows the
  previous answer after a tool latency of 0.2-3 s, not a human think time.

As in multiturn, the history is the workload's own fixed text (not the engine's output),
so the request sequence is a pure function of the seed and every word is one simulator
token (text.py): ``prompt_tokens`` is exact and prefix structure is known offline.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from bench.workloads.base import BenchRequest, context_hash, in_arrival_order
from bench.workloads.text import block_text, words


@dataclass(frozen=True, slots=True)
class AgenticConfig:
    """Defaults: ~1,000 requests over ~100-115 simulated s (seed 0: 1,008 over 116 s), on
    average 50-60 % of the cold prefill capacity of 8 llama-3-8b@h100-80gb workers (~20 k
    tokens/s each; 10-s windows up to ~80-100 %), but ~92 % of the prompt tokens are a
    prefix of an earlier request, so with every such prefix cached the fleet would be
    ~5 % loaded: the routing decides which end of that range a fleet sees."""

    conversations: int = 90  # agent sessions
    personas: int = 3  # distinct tool prompts; 1 = one prompt for every session
    persona_alpha: float = 1.0  # Zipf exponent of persona popularity
    tool_prompt_tokens: int = 4000
    task_tokens: tuple[int, int] = (50, 300)  # the task that opens a session
    steps: tuple[int, int] = (3, 20)  # requests per session
    tool_result_tokens: tuple[int, int] = (200, 2000)  # log-uniform
    action_tokens: tuple[int, int] = (30, 200)  # log-uniform, at most that step's output
    output_tokens: tuple[int, int] = (30, 300)  # max_tokens per step, log-uniform
    tool_latency_s: tuple[float, float] = (0.2, 3.0)  # log-uniform, simulated seconds
    answer_s_per_token: float = 0.01  # simulated decode time of an answer, as multiturn
    rate: float = 1.2  # new sessions per simulated second (mean, over bursts)
    burst_size: tuple[int, int] = (1, 6)  # sessions per burst, uniform
    burst_spread_s: float = 0.25  # a burst's sessions start within this many seconds
    count: int | None = None
    send_context_hash: bool = False
    seed: int = 0


def _log_uniform(rng: random.Random, lo: float, hi: float) -> float:
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))


def tool_prompt(cfg: AgenticConfig, persona: int) -> str:
    """The fixed tool-and-system prompt of one persona."""
    return block_text(f"agent-tools:{cfg.seed}", persona, cfg.tool_prompt_tokens)


def generate(cfg: AgenticConfig) -> list[BenchRequest]:
    """The request sequence; a pure function of cfg (seeded)."""
    if cfg.personas < 1:
        raise ValueError(f"personas must be >= 1: {cfg.personas}")
    rng = random.Random(f"agentic:{cfg.seed}")
    weights = [1.0 / (r + 1) ** cfg.persona_alpha for r in range(cfg.personas)]
    burst_rate = cfg.rate / ((cfg.burst_size[0] + cfg.burst_size[1]) / 2)
    pending: list[BenchRequest] = []
    burst_t, left_in_burst = 0.0, 0
    for session in range(cfg.conversations):
        if left_in_burst == 0:
            burst_t += rng.expovariate(burst_rate)
            left_in_burst = rng.randint(*cfg.burst_size)
        left_in_burst -= 1
        t = burst_t + rng.uniform(0.0, cfg.burst_spread_s)
        persona = rng.choices(range(cfg.personas), weights=weights)[0]
        task = rng.randint(*cfg.task_tokens)
        history = tool_prompt(cfg, persona) + words(task, rng)
        tokens = cfg.tool_prompt_tokens + task
        ctx = context_hash(f"agent:{cfg.seed}:{session}") if cfg.send_context_hash else None
        for _step in range(rng.randint(*cfg.steps)):
            out = round(_log_uniform(rng, *cfg.output_tokens))
            pending.append(BenchRequest(
                index=-1, arrival_s=t, prompt=history, prompt_tokens=tokens, max_tokens=out,
                context_hash=ctx, group=f"session:{session}"))
            # the action the agent keeps (its tool call; reasoning is not kept), then the
            # tool's result, both appended for the next step
            action = min(out, round(_log_uniform(rng, *cfg.action_tokens)))
            result = round(_log_uniform(rng, *cfg.tool_result_tokens))
            history += words(action, rng) + words(result, rng)
            tokens += action + result
            t += out * cfg.answer_s_per_token + _log_uniform(rng, *cfg.tool_latency_s)
    return in_arrival_order(pending, cfg.count)
