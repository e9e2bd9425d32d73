"""The agentic workload: deterministic, growing session histories behind shared tool prompts.

Offline (no processes): checks the prefix structure the workload promises, that prompt
lengths are exact under the simulator's one-word-one-token text, and the CLI options.
"""

from __future__ import annotations

from collections import defaultdict
from itertools import pairwise

from bench.workloads import WORKLOADS, BenchRequest, make_workload
from bench.workloads.agentic import AgenticConfig, generate, tool_prompt
from bench.workloads.base import context_hash

SMALL = {"conversations": 24, "rate": 2.0}


def _sessions(reqs: list[BenchRequest]) -> dict[str, list[BenchRequest]]:
    by: dict[str, list[BenchRequest]] = defaultdict(list)
    for r in reqs:
        by[r.group].append(r)
    return by


def test_registered_and_deterministic_per_seed() -> None:
    assert "agentic" in WORKLOADS
    a = make_workload("agentic", seed=1, **SMALL)
    assert a == make_workload("agentic", seed=1, **SMALL)
    assert a == generate(AgenticConfig(seed=1, **SMALL))
    b = make_workload("agentic", seed=2, **SMALL)
    assert [r.prompt for r in a] != [r.prompt for r in b]


def test_arrivals_sorted_indices_and_exact_prompt_tokens() -> None:
    reqs = make_workload("agentic", seed=0, **SMALL)
    assert [r.index for r in reqs] == list(range(len(reqs)))
    assert all(x.arrival_s <= y.arrival_s for x, y in pairwise(reqs))
    for r in reqs:
        assert r.prompt_tokens == len(r.prompt.split())  # one word = one simulator token
        assert r.prompt.startswith(" ") and "  " not in r.prompt
        assert 30 <= r.max_tokens <= 300


def test_each_step_extends_the_previous_request_of_its_session() -> None:
    cfg = AgenticConfig(seed=0, **SMALL)
    sessions = _sessions(generate(cfg))
    assert len(sessions) == cfg.conversations
    for steps in sessions.values():
        assert cfg.steps[0] <= len(steps) <= cfg.steps[1]
        for prev, cur in pairwise(steps):
            assert cur.prompt.startswith(prev.prompt)
            # one step adds the agent's action (30-200) and a tool result (200-2,000)
            grown = cur.prompt_tokens - prev.prompt_tokens
            assert cfg.action_tokens[0] + cfg.tool_result_tokens[0] <= grown \
                <= cfg.action_tokens[1] + cfg.tool_result_tokens[1]
            # the next step follows the answer after a tool latency, not a think time
            gap = cur.arrival_s - prev.arrival_s
            assert cfg.tool_latency_s[0] <= gap <= (cfg.tool_latency_s[1]
                                                    + prev.max_tokens * cfg.answer_s_per_token)


def test_sessions_of_one_persona_share_its_tool_prompt() -> None:
    cfg = AgenticConfig(seed=0, **SMALL)
    prompts = [tool_prompt(cfg, p) for p in range(cfg.personas)]
    assert all(len(p.split()) == cfg.tool_prompt_tokens for p in prompts)
    assert len({p.split()[0] for p in prompts}) == cfg.personas  # distinct from token 0
    persona_sessions: dict[int, set[str]] = defaultdict(set)
    for group, steps in _sessions(generate(cfg)).items():
        owners = [p for p, text in enumerate(prompts) if steps[0].prompt.startswith(text)]
        assert len(owners) == 1
        assert all(r.prompt.startswith(prompts[owners[0]]) for r in steps)
        # the tool prompt is followed by the session's own task
        assert steps[0].prompt_tokens > cfg.tool_prompt_tokens
        persona_sessions[owners[0]].add(group)
    assert sorted(persona_sessions) == list(range(cfg.personas))
    # Zipf: the first persona is the most popular
    assert len(persona_sessions[0]) == max(len(s) for s in persona_sessions.values())
    one = generate(AgenticConfig(seed=0, personas=1, **SMALL))
    assert all(r.prompt.startswith(prompts[0]) for r in one)


def test_sessions_start_in_bursts() -> None:
    cfg = AgenticConfig(seed=0, conversations=60, burst_size=(4, 4), burst_spread_s=0.25)
    sessions = _sessions(generate(cfg))
    starts = [sessions[f"session:{i}"][0].arrival_s for i in range(cfg.conversations)]
    bursts = [starts[i:i + 4] for i in range(0, len(starts), 4)]
    # sessions 0-3 start together, then 4-7, ...: within the spread, bursts seconds apart
    assert all(max(b) - min(b) <= cfg.burst_spread_s for b in bursts)
    gaps = [min(b) - max(a) for a, b in pairwise(bursts)]
    assert sum(gaps) / len(gaps) > 1.0


def test_count_truncates_and_context_hash_names_the_session() -> None:
    full = make_workload("agentic", seed=0, **SMALL)
    cut = make_workload("agentic", seed=0, count=40, **SMALL)
    assert len(full) > 40 and cut == full[:40]
    assert all(r.context_hash is None for r in full)
    sent = make_workload("agentic", seed=0, send_context_hash=True, **SMALL)
    assert [r.prompt for r in sent] == [r.prompt for r in full]
    for r in sent:
        session = r.group.removeprefix("session:")
        assert r.context_hash == context_hash(f"agent:0:{session}")
