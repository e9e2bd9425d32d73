"""Claim 2: sharing a long document's prefix across concurrent questions.

The claims: ~80 % less KV with 10 concurrent questions on one background document and
~98 % with 100; 3.58x throughput on a shared few-shot prefix (vLLM paper, fig. 16: that
figure is paged + sharing against Orca-Oracle, a contiguous allocator reserving each
request's exact length, on WMT16 translation with 1-shot / 5-shot prompts).

Document run: N questions (32 tokens each, 128-token answers) on one document arrive at
once; prefix caching on or off; peak KV blocks, mean TTFT, output tokens per second.
Few-shot run: a closed loop of 256 clients over 768 requests sharing a 1-shot (80-token)
or 5-shot (341-token) prefix, ~36-token sentences in, ~40-token translations out, as in
the paper's setting; three allocators: contiguous exact, paged without and with sharing.
"""

from __future__ import annotations

from bench.engine.common import Job, Table, drive, make_engine, ms, num, pct, seeded, tokens
from bench.engine.plotting import bar_plot
from engine_worker.sim.profiles import load_profile

QUESTIONS = (1, 10, 100)
QUESTION_TOKENS = 32
ANSWER_TOKENS = 128
SHOTS = {"1-shot": 80, "5-shot": 341}
FEW_SHOT_MODES = {"contiguous exact (Orca-Oracle)": {"kv_allocation": "contiguous",
                                                     "contiguous_reserve": "request"},
                  "paged, no prefix caching": {"enable_prefix_caching": False},
                  "paged + prefix caching": {}}


def doc_tokens(profile: str) -> int:
    return min(3000, load_profile(profile).model.max_model_len - 400)


def document_jobs(profile: str, n: int, seed: int = 0) -> list[Job]:
    rng = seeded("prefix-doc", seed)
    doc = tokens(rng, doc_tokens(profile))
    return [Job(doc + tokens(rng, QUESTION_TOKENS), ANSWER_TOKENS) for _ in range(n)]


def document_run(profile: str, n: int, caching: bool) -> dict[str, float]:
    engine = make_engine(profile, enable_prefix_caching=caching)
    res = drive(engine, document_jobs(profile, n))
    return {"peak_blocks": res.peak_used_blocks, "capacity": engine.num_gpu_blocks,
            "ttft": res.mean(lambda s: s.ttft), "tokens_per_s": res.tokens_per_s,
            "preemptions": res.preemptions}


def few_shot_jobs(prefix: int, count: int, seed: int = 0) -> list[Job]:
    rng = seeded(f"few-shot-{prefix}", seed)
    shared = tokens(rng, prefix)
    return [Job(shared + tokens(rng, int(rng.integers(24, 49))), int(rng.integers(28, 53)))
            for _ in range(count)]


def few_shot_run(profile: str, prefix: int, mode: str, count: int) -> float:
    engine = make_engine(profile, **FEW_SHOT_MODES[mode])
    return drive(engine, few_shot_jobs(prefix, count), concurrency=256).tokens_per_s


def run(profiles: list[str], quick: bool) -> list[Table]:
    table = Table("prefix_sharing", "2. Prefix sharing: one document, N concurrent questions",
                  ["profile", "questions", "peak KV blocks, caching off", "on", "KV saved",
                   "mean TTFT off / on (ms)", "output tok/s off / on", "throughput ratio"])
    bars: dict[str, list[float]] = {"prefix caching off": [], "prefix caching on": []}
    groups = []
    for profile in profiles:
        for n in QUESTIONS:
            off, on = document_run(profile, n, False), document_run(profile, n, True)
            capped = " (capacity-bound)" if off["peak_blocks"] >= off["capacity"] - 1 else ""
            table.rows.append([
                profile, str(n), num(off["peak_blocks"]) + capped, num(on["peak_blocks"]),
                pct(1 - on["peak_blocks"] / off["peak_blocks"]),
                f"{ms(off['ttft'])} / {ms(on['ttft'])}",
                f"{num(off['tokens_per_s'])} / {num(on['tokens_per_s'])}",
                f"{on['tokens_per_s'] / off['tokens_per_s']:.2f}x"])
            groups.append(f"{profile.split('@')[0]}\nN={n}")
            bars["prefix caching off"].append(off["peak_blocks"])
            bars["prefix caching on"].append(on["peak_blocks"])
    table.plot = bar_plot(
        "engine-prefix-sharing.png", groups, bars,
        title="Peak KV blocks, one document + N concurrent questions (32-token questions, "
        "128-token answers; document 3,000 tokens, OPT-13B 1,648)",
        xlabel="model, concurrent questions", ylabel="peak KV blocks in use (16 tokens each, "
        "log scale)", logy=True)
    count = 512 if quick else 768
    few = Table("prefix_few_shot", "2b. Few-shot prefix: throughput by allocator",
                ["profile", "prefix", *FEW_SHOT_MODES, "sharing vs Orca-Oracle",
                 "sharing vs no caching"])
    for profile in profiles:
        for shot, prefix in SHOTS.items():
            tps = [few_shot_run(profile, prefix, mode, count) for mode in FEW_SHOT_MODES]
            few.rows.append([profile, f"{shot} ({prefix} tokens)", *(num(t) for t in tps),
                             f"{tps[2] / tps[0]:.2f}x", f"{tps[2] / tps[1]:.2f}x"])
    few.notes.append(f"Output tokens per simulated second, closed loop of 256 clients, "
                     f"{count} requests.")
    return [table, few]
