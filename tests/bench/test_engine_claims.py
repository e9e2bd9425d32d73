"""Each engine claim of ``python -m bench engine``, reduced, keeps its direction.

Reduced runs of the same code (bench/engine/) on the simulator's KV manager and scheduler,
small enough for seconds: if paging, prefix sharing, copy-on-write or the swap cost model
broke, the direction would flip or vanish.
"""

from __future__ import annotations

from bench.engine import beam, prefix_sharing, swap, utilisation
from bench.engine.common import Job, seeded, tokens
from engine_worker.sim.profiles import load_profile

PROFILE = "llama-3-8b@h100-80gb"


def rag_jobs(count: int) -> list[Job]:
    rng = seeded("test-utilisation")
    return [Job(tokens(rng, 1000), int(rng.integers(20, 60))) for _ in range(count)]


def test_paged_allocation_beats_a_contiguous_max_model_len_reservation() -> None:
    work = rag_jobs(12)
    paged = utilisation.measure(PROFILE, "paged", 12, work, num_gpu_blocks=1200)
    contiguous = utilisation.measure(PROFILE, "contiguous max_model_len", 12, work,
                                     num_gpu_blocks=1200)
    assert paged["utilisation"] > 0.9 > 0.5 > contiguous["utilisation"]
    assert contiguous["internal"] > 0.3  # max_model_len reserved, most never written
    assert paged["peak_clean"] > contiguous["peak_running"] == 1200 * 16 // 8192
    assert paged["tokens_per_s"] > contiguous["tokens_per_s"]


def test_an_exact_contiguous_reservation_fragments_externally() -> None:
    rng = seeded("test-external")
    work = [Job(tokens(rng, int(rng.integers(200, 1800))), 40) for _ in range(24)]
    m = utilisation.measure(PROFILE, "contiguous exact (oracle)", 24, work, num_gpu_blocks=600)
    assert m["external"] > 0


def test_sharing_a_document_prefix_saves_blocks_and_time() -> None:
    off = prefix_sharing.document_run(PROFILE, 10, caching=False)
    on = prefix_sharing.document_run(PROFILE, 10, caching=True)
    assert on["peak_blocks"] < 0.3 * off["peak_blocks"]
    assert on["ttft"] < off["ttft"] and on["tokens_per_s"] > off["tokens_per_s"]


def test_copy_on_write_saves_blocks_and_copies_in_beam_search() -> None:
    prompt = tokens(seeded("test-beam"), 256)
    full = beam.beam_search(prompt, 4, 32, copy=True)
    cow = beam.beam_search(prompt, 4, 32, copy=False)
    assert cow.peak_blocks < 0.6 * full.peak_blocks
    assert 0 < cow.blocks_copied < full.blocks_copied


def test_swap_gets_slower_as_blocks_shrink() -> None:
    prof = load_profile(PROFILE)
    costs = [swap.swap_seconds(prof, 800, bs) for bs in swap.BLOCK_SIZES]
    assert costs == sorted(costs, reverse=True) and costs[0] > 3 * costs[-1]
    small = swap.measure(PROFILE, 8, "swap", quick=True)
    large = swap.measure(PROFILE, 64, "swap", quick=True)
    assert small.preemptions and large.preemptions
    assert small.mean(lambda s: s.e2e) > large.mean(lambda s: s.e2e)
