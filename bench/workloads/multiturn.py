"""Multi-turn chat: each conversation's prompt is its whole history plus a new user turn.

Conversations start as a Poisson process; a turn follows the previous one after the
previous answer would have finished plus a think time. The assistant turns in the history
are the workload's own fixed text (not the engine's output), so the request sequence is
a pure function of the seed and its prefix structure can be computed offline; the
history up to the newest user turn is what a prefix cache can reuse.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from bench.workloads.base import BenchRequest, context_hash, in_arrival_order
from bench.workloads.text import block_text, words


@dataclass(frozen=True, slots=True)
class MultiturnConfig:
    conversations: int = 100
    turns: tuple[int, int] = (2, 8)
    system_tokens: int = 300
    user_tokens: tuple[int, int] = (30, 300)
    answer_tokens: tuple[int, int] = (50, 400)
    think_s: float = 5.0  # mean simulated seconds between an answer and the next turn
    rate: float = 2.0  # new conversations per simulated second
    count: int | None = None
    send_context_hash: bool = False
    seed: int = 0


def generate(cfg: MultiturnConfig) -> list[BenchRequest]:
    rng = random.Random(f"multiturn:{cfg.seed}")
    system = block_text(f"mt-system:{cfg.seed}", 0, cfg.system_tokens)
    pending: list[BenchRequest] = []
    start = 0.0
    for conv in range(cfg.conversations):
        start += rng.expovariate(cfg.rate)
        t = start
        history, tokens = system, cfg.system_tokens
        for _turn in range(rng.randint(*cfg.turns)):
            u = rng.randint(*cfg.user_tokens)
            a = rng.randint(*cfg.answer_tokens)
            history += words(u, rng)
            tokens += u
            pending.append(BenchRequest(
                index=-1, arrival_s=t, prompt=history, prompt_tokens=tokens, max_tokens=a,
                context_hash=context_hash(f"conv:{cfg.seed}:{conv}") if cfg.send_context_hash
                else None, group=f"conv:{conv}"))
            history += words(a, rng)
            tokens += a
            t += a * 0.01 + rng.expovariate(1.0 / cfg.think_s)
    return in_arrival_order(pending, cfg.count)
