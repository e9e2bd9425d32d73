"""How much precise keying (tokenize + vLLM block hashes) stalls the router's event loop.

Usage: .venv/bin/python scripts/precise_loop_stall.py

Builds the tiny test tokenizer in a temporary directory, then keys 8 prompts of ~12 k tokens
at once, through PreciseMatcher.key (a worker thread) and inline, while a 0.5 ms ticker
measures the loop's longest stall. Prints medians of 7 runs.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "scripts")]

import make_tiny_model  # noqa: E402

from router.fleet.workers import Worker  # noqa: E402
from router.precise.exact import ExactResidency  # noqa: E402
from router.precise.feeds import KVEventFeeds  # noqa: E402
from router.precise.matcher import PreciseMatcher  # noqa: E402
from router.precise.tokenize import PromptTokenizer  # noqa: E402
from router.protocol.kv_feed import FeedParams  # noqa: E402
from tests.engine.vllm_fleet import document  # noqa: E402

BLOCK, KEYS, RUNS = 16, 8, 7


async def stall_ms(work) -> tuple[float, float]:
    """(total ms, longest gap between 0.5 ms ticks) while ``work`` runs."""
    gaps: list[float] = []

    async def ticker() -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.0005)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.02)
    started = time.perf_counter()
    await work
    total = time.perf_counter() - started
    task.cancel()
    return total * 1e3, max(gaps) * 1e3


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        make_tiny_model.build_tokenizer(Path(tmp), 4096, 0)
        tokenizer = PromptTokenizer(tmp)
    feeds = KVEventFeeds(ExactResidency())
    feeds._params["w"] = FeedParams("tcp://unused:1", None, "kv-events", BLOCK, "0")
    matcher = PreciseMatcher({"m": tokenizer}, feeds, max_blocks=1024, key_blocks=32)
    worker = Worker(id="w", url="http://unused")
    body = {"prompt": document(7, 4000)}
    print(f"prompt: {len(tokenizer.completion_ids(body))} tokens, {KEYS} keyed at once")

    async def threaded() -> None:
        await asyncio.gather(*(matcher.key(body, "m", False, [worker]) for _ in range(KEYS)))

    async def inline() -> None:
        for _ in range(KEYS):
            matcher._ids_and_chain(tokenizer, body, False, BLOCK, "0")
            await asyncio.sleep(0)

    results: dict[str, list[tuple[float, float]]] = {"to_thread": [], "inline": []}
    for _ in range(RUNS):
        results["to_thread"].append(await stall_ms(threaded()))
        results["inline"].append(await stall_ms(inline()))
    for name, rows in results.items():
        print(f"{name:>9}: total {statistics.median(r[0] for r in rows):.0f} ms, "
              f"longest loop stall {statistics.median(r[1] for r in rows):.1f} ms (median)")


if __name__ == "__main__":
    asyncio.run(main())
