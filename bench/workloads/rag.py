"""RAG: documents with Zipf popularity behind a shared system prompt, Poisson arrivals.

Each request is ``system prompt + 1-3 retrieved documents (in retrieved order) + a short
question``. Only leading tokens are reusable by a prefix cache, so two requests share
KV beyond the system prompt when they start with the same first document, and share
more when their documents agree further in order. That is what real RAG traffic does
to a prefix cache, and it is not tuned to flatter any policy.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from bench.workloads.base import BenchRequest, context_hash
from bench.workloads.text import block_text, words


@dataclass(frozen=True, slots=True)
class RagConfig:
    """Defaults: a knowledge base ~3x one H100's KV cache (~140 such docs) and ~1/3 of
    an 8-worker fleet's, so routing decides whether the fleet caches it."""

    docs: int = 400
    doc_tokens: int = 3000  # median of a lognormal
    doc_sigma: float = 0.35
    alpha: float = 1.0  # Zipf exponent of document popularity
    system_tokens: int = 200
    docs_per_request: tuple[int, int] = (1, 3)
    question_tokens: tuple[int, int] = (15, 60)
    output_tokens: int = 64  # median of a lognormal
    output_sigma: float = 0.6
    output_max: int = 512
    rate: float = 20.0  # requests per simulated second
    count: int = 1200
    send_context_hash: bool = True
    # what X-Context-Hash names: "all" = the whole retrieved context (the SDK's contract:
    # sha256 of the 1-3 documents in order), "first" = the first document only (an
    # application's own key, README "The key contract": the part most requests share)
    context_hash_scope: str = "all"
    seed: int = 0


def _lognormal_int(rng: random.Random, median: float, sigma: float, lo: int, hi: int) -> int:
    return max(lo, min(hi, round(median * math.exp(rng.gauss(0.0, sigma)))))


def generate(cfg: RagConfig) -> list[BenchRequest]:
    """The request sequence; a pure function of cfg (seeded)."""
    rng = random.Random(f"rag:{cfg.seed}")
    lengths = [_lognormal_int(rng, cfg.doc_tokens, cfg.doc_sigma, 64, 4 * cfg.doc_tokens)
               for _ in range(cfg.docs)]
    # popularity rank -> document id, so that length and popularity are independent
    order = list(range(cfg.docs))
    rng.shuffle(order)
    cum: list[float] = []
    total = 0.0
    for rank in range(cfg.docs):
        total += 1.0 / (rank + 1) ** cfg.alpha
        cum.append(total)
    system = block_text(f"rag-system:{cfg.seed}", 0, cfg.system_tokens)
    doc_cache: dict[int, str] = {}

    def doc(i: int) -> str:
        if i not in doc_cache:
            doc_cache[i] = block_text(f"rag-doc:{cfg.seed}", i, lengths[i])
        return doc_cache[i]

    if cfg.context_hash_scope not in ("all", "first"):
        raise ValueError(f"context_hash_scope must be 'all' or 'first': {cfg.context_hash_scope}")
    out: list[BenchRequest] = []
    t = 0.0
    for index in range(cfg.count):
        t += rng.expovariate(cfg.rate)
        k = min(rng.randint(*cfg.docs_per_request), cfg.docs)
        picked: list[int] = []
        while len(picked) < k:
            d = order[rng.choices(range(cfg.docs), cum_weights=cum)[0]]
            if d not in picked:
                picked.append(d)
        q_len = rng.randint(*cfg.question_tokens)
        question = words(q_len, rng)
        context = "".join(doc(d) for d in picked)
        prompt = system + context + question
        out.append(BenchRequest(
            index=index, arrival_s=t, prompt=prompt,
            prompt_tokens=cfg.system_tokens + sum(lengths[d] for d in picked) + q_len,
            max_tokens=_lognormal_int(rng, cfg.output_tokens, cfg.output_sigma, 1,
                                      cfg.output_max),
            context_hash=(context_hash(context if cfg.context_hash_scope == "all"
                                       else doc(picked[0]))
                          if cfg.send_context_hash else None),
            group="docs:" + ",".join(map(str, picked))))
    return out
