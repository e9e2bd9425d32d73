"""Mooncake conversation trace replay (shared/traces/mooncake_conversation_trace.jsonl).

Each trace hash id becomes a fixed 512-token text block (text.py: one word = one token
of the simulator's tokenizer), so prompts that share leading ids share a leading text
prefix and therefore leading KV blocks; the last block is cut to ``input_length``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import orjson

from bench.workloads.base import BenchRequest
from bench.workloads.text import block_text, truncate_tokens

TRACE_BLOCK_TOKENS = 512
REPO = Path(__file__).resolve().parents[2]


def default_trace_path() -> Path:
    """In CI the repo is cloned beside shared/, here shared/ is at /work/shared."""
    for base in (REPO.parent / "shared", Path("/work/shared")):
        path = base / "traces" / "mooncake_conversation_trace.jsonl"
        if path.exists():
            return path
    return REPO.parent / "shared" / "traces" / "mooncake_conversation_trace.jsonl"


@dataclass(frozen=True, slots=True)
class MooncakeConfig:
    path: str = ""
    start_s: float = 0.0  # window of the trace to replay, in trace seconds
    duration_s: float | None = None
    arrival_scale: float = 1.0  # simulated arrival = trace time x this (<1 replays faster)
    sample: float = 1.0  # keep each request with this probability (seeded)
    # keep each conversation (requests sharing their first two hash ids: the shared system
    # block, then the conversation's own first block) with this probability (seeded): unlike
    # ``sample`` it keeps every turn of a kept conversation, so the trace's reuse survives
    sample_conversations: float = 1.0
    count: int | None = None
    max_input_tokens: int | None = None  # skip longer prompts (engine max_model_len)
    send_context_hash: bool = False  # the trace has no notion of "context"; off
    seed: int = 0


def load_trace(path: str | Path) -> list[dict]:
    with open(path, "rb") as fh:
        return [orjson.loads(line) for line in fh if line.strip()]


def select(rows: list[dict], cfg: MooncakeConfig) -> list[dict]:
    """The rows a run replays, in trace order."""
    rng = random.Random(f"mooncake:{cfg.seed}")
    out = []
    for row in rows:
        ts = row["timestamp"] / 1000.0
        if ts < cfg.start_s:
            continue
        if cfg.duration_s is not None and ts >= cfg.start_s + cfg.duration_s:
            break
        if cfg.sample < 1.0 and rng.random() >= cfg.sample:
            continue
        if cfg.sample_conversations < 1.0 and not keep_conversation(row, cfg):
            continue
        if cfg.max_input_tokens is not None and row["input_length"] > cfg.max_input_tokens:
            continue
        out.append(row)
        if cfg.count is not None and len(out) >= cfg.count:
            break
    return out


def conversation(row: dict) -> tuple[int, ...]:
    return tuple(row["hash_ids"][:2])


def keep_conversation(row: dict, cfg: MooncakeConfig) -> bool:
    """A pure function of (seed, conversation): every turn of a conversation agrees."""
    conv = ",".join(map(str, conversation(row)))
    return random.Random(f"mooncake-conv:{cfg.seed}:{conv}").random() < cfg.sample_conversations


def prompt_for(row: dict) -> tuple[str, int]:
    """The prompt text of a trace row and its exact token count."""
    ids = row["hash_ids"]
    n = min(row["input_length"], TRACE_BLOCK_TOKENS * len(ids))
    parts = []
    remaining = n
    for hid in ids:
        take = min(TRACE_BLOCK_TOKENS, remaining)
        text = block_text("mooncake", hid, TRACE_BLOCK_TOKENS)
        parts.append(text if take == TRACE_BLOCK_TOKENS else truncate_tokens(text, take))
        remaining -= take
        if remaining <= 0:
            break
    return "".join(parts), n


def generate(cfg: MooncakeConfig) -> list[BenchRequest]:
    rows = select(load_trace(cfg.path or default_trace_path()), cfg)
    if not rows:
        return []
    t0 = rows[0]["timestamp"] / 1000.0
    out = []
    for index, row in enumerate(rows):
        prompt, n = prompt_for(row)
        out.append(BenchRequest(index=index,
                                arrival_s=(row["timestamp"] / 1000.0 - t0) * cfg.arrival_scale,
                                prompt=prompt, prompt_tokens=n,
                                max_tokens=max(1, int(row["output_length"])),
                                group="conv:" + ",".join(map(str, conversation(row)))))
    return out
