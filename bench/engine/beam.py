"""Claim 3: beam search with block sharing and copy-on-write against full copies per fork.

The claim (vLLM paper, sec. 6.3): 37.6-55.2 % less KV at beam width 4 (the range is over
its datasets). vLLM 0.32 runs beam search in its OpenAI server, as one-token requests per
beam whose shared prefixes the prefix cache finds, so the engine has no beam fork to
measure; here the search runs on the simulator's KV manager directly.

Each step, each of the W live beams proposes 2W candidates; the W best cumulative
log-probabilities survive (as vLLM's beam search keeps them). A parent with no surviving
child is freed first; one with c children is forked c-1 times and each child appends its
token. With sharing, a fork shares every block and the first append into a shared partial
last block copies that one block (copy-on-write); without it, every fork copies all the
parent's blocks. Candidate log-probabilities: a softmax over 2W logits ~ N(0, sigma^2)
per beam and step, seeded (sigma 2: a peaked next-token distribution, as an LM's usually
is; flatter ones keep more distinct lineages and share less).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from bench.engine.common import Table, num, pct, seeded, tokens
from bench.engine.plotting import bar_plot
from engine_worker.sim.hashing import BlockHasher
from engine_worker.sim.kv_cache import KVCacheManager
from engine_worker.sim.profiles import load_profile

WIDTHS = (2, 4, 8)
PROMPTS = {"RAG prompt": 3000, "short prompt": 256}
OUTPUT_TOKENS = 128
SIGMA = 2.0


@dataclass
class BeamResult:
    peak_blocks: int
    blocks_copied: int


def beam_search(prompt: list[int], width: int, output_tokens: int, copy: bool,
                block_size: int = 16, seed: int = 0) -> BeamResult:
    """Run one beam search on a fresh KV manager; peak blocks held and blocks copied."""
    need = (len(prompt) + output_tokens) // block_size + 2
    kv = KVCacheManager(need * width * 2 + 8, BlockHasher(block_size, seed="0"),
                        prefix_caching=False)
    rng = seeded(f"beam-{width}", seed)
    ids = itertools.count()
    first = next(ids)
    kv.start(first, [], prompt)
    kv.append(first, prompt)
    beams: list[tuple[int, float]] = [(first, 0.0)]  # (sequence id, cumulative log-prob)
    for _ in range(output_tokens):
        cands = []
        for seq, score in beams:
            logits = rng.normal(0.0, SIGMA, 2 * width)
            logp = logits - np.log(np.exp(logits).sum())
            cands += [(score + float(lp), seq, tok) for tok, lp in enumerate(logp)]
        cands.sort(key=lambda c: -c[0])
        chosen = cands[:width]
        children: dict[int, list[tuple[float, int]]] = {}
        for score, seq, tok in chosen:
            children.setdefault(seq, []).append((score, tok))
        for seq, _ in beams:  # dropped beams go first, so no copy waits on them
            if seq not in children:
                kv.free(seq)
        new_beams = []
        for seq, kids in children.items():
            for score, tok in kids[1:]:
                child = next(ids)
                if not kv.fork(seq, child, copy=copy):
                    raise RuntimeError("beam KV pool too small")
                new_beams.append((child, score, tok))
            new_beams.append((seq, kids[0][0], kids[0][1]))
        for seq, _, tok in new_beams:
            if not kv.append(seq, [tok]):
                raise RuntimeError("beam KV pool too small")
        beams = [(seq, score) for seq, score, _ in new_beams]
    return BeamResult(kv.peak_used_blocks, kv.blocks_copied)


def run(profiles: list[str], quick: bool) -> list[Table]:
    table = Table("beam", "3. Beam search: block sharing + copy-on-write against full copies",
                  ["profile", "prompt", "beam width", "peak KV blocks, full copies",
                   "sharing + CoW", "KV saved", "bytes copied, full copies", "sharing + CoW"])
    groups, bars = [], {"full copy on every fork": [], "sharing + copy-on-write": []}
    for profile in profiles:
        block_bytes = 16 * load_profile(profile).model.kv_bytes_per_token
        for label, length in PROMPTS.items():
            prompt = tokens(seeded(f"beam-prompt-{length}"), min(
                length, load_profile(profile).model.max_model_len - OUTPUT_TOKENS - 16))
            for width in WIDTHS:
                full = beam_search(prompt, width, OUTPUT_TOKENS, copy=True)
                cow = beam_search(prompt, width, OUTPUT_TOKENS, copy=False)
                table.rows.append([profile, f"{label} ({len(prompt):,} tokens)", str(width),
                                   num(full.peak_blocks), num(cow.peak_blocks),
                                   pct(1 - cow.peak_blocks / full.peak_blocks),
                                   _bytes(full.blocks_copied * block_bytes),
                                   _bytes(cow.blocks_copied * block_bytes)])
                if profile == profiles[0]:
                    groups.append(f"{label}\nW={width}")
                    bars["full copy on every fork"].append(full.peak_blocks)
                    bars["sharing + copy-on-write"].append(cow.peak_blocks)
    table.plot = bar_plot(
        "engine-beam.png", groups, bars,
        title=f"Peak KV blocks of one beam search ({profiles[0]}, {OUTPUT_TOKENS} output "
        "tokens, 16-token blocks)", xlabel="prompt, beam width",
        ylabel="peak KV blocks held (16 tokens each, log scale)", logy=True)
    table.notes.append(
        f"{OUTPUT_TOKENS} output tokens per beam; bytes copied = blocks copied x block "
        "bytes (16 tokens x the profile's KV bytes per token). Selection model: see "
        "bench/engine/beam.py (sigma 2.0, seeded).")
    return [table]


def _bytes(n: float) -> str:
    if n <= 0:
        return "0"
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    k = min(len(units) - 1, int(math.log(n, 1024)))
    return f"{n / 1024 ** k:,.1f} {units[k]}"
