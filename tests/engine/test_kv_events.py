"""KV event subscriber against a real ZMQ PUB/ROUTER speaking vLLM's protocol."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import msgpack
import pytest

from router.precise.exact import ExactResidency, block_key
from router.protocol.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventSubscriber,
    decode_message,
    subscribed,
)
from tests.engine.vllm_publisher import FakePublisher, cleared, removed, stored
from tests.support import free_port

W = "w1"


async def until(check: Callable[[], bool], within_s: float = 5.0) -> None:
    deadline = time.monotonic() + within_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


async def synced(pub: FakePublisher, sub: KVEventSubscriber) -> None:
    """Publish empty batches until one gets through live (ZMQ's slow joiner drops the
    first). Batches the catch-up replayed do not count: they came over the replay socket,
    and a live event sent before the subscription joins is lost with nothing after it to
    show the gap (this test flaked 4 times in 6 when it counted them)."""
    deadline = time.monotonic() + 5
    replayed = sub.stats.batches
    while sub.stats.batches == replayed:
        assert time.monotonic() < deadline, "subscriber never received a batch"
        await pub.publish([])
        await asyncio.sleep(0.02)


def test_decode_map_and_array_forms() -> None:
    events = [stored([1, 2]), removed([1]), cleared(),
              stored([b"\x00" * 24 + b"\x00\x00\x00\x00\x00\x00\x00\x07"], array_like=True),
              removed([3], array_like=True), cleared(array_like=True),
              {"type": "SomethingNewer", "x": 1}]
    payload = msgpack.packb([1.5, events, 0], use_bin_type=True)
    batch = decode_message([b"kv", (9).to_bytes(8, "big"), payload])
    assert batch.seq == 9 and batch.ts == 1.5 and batch.dp_rank == 0
    kinds = [type(e) for e in batch.events]
    assert kinds == [BlockStored, BlockRemoved, AllBlocksCleared] * 2  # unknown kind skipped
    first = batch.events[0]
    assert isinstance(first, BlockStored)
    assert first.block_hashes == [1, 2] and first.block_size == 16 and first.medium == "GPU"
    assert block_key(batch.events[3].block_hashes[0]) == 7  # bytes -> low 64 bits


def test_decode_rejects_wrong_frame_count() -> None:
    with pytest.raises(ValueError):
        decode_message([b"kv", b"\x00" * 8])


async def test_residency_follows_stored_and_removed() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    residency = ExactResidency()
    async with FakePublisher(endpoint) as pub:
        sub = KVEventSubscriber(W, endpoint, residency, topic="kv")
        async with subscribed(sub):
            await synced(pub, sub)
            await pub.publish([stored([1, 2, 3]), stored([b"\x01" * 32])])
            await pub.publish([removed([2]), stored([4], medium="CPU")])
            await until(lambda: sub.stats.batches >= 3 and len(residency) == 3)
            assert residency.resident(W) == {1, 3, block_key(b"\x01" * 32)}
            assert residency.match(W, [1, 2, 3]) == 1
            assert not residency.contains(W, 4), "CPU-tier events are not GPU residency"
            await pub.publish([cleared()])
            await until(lambda: len(residency) == 0)


async def test_duplicate_blocks_stay_until_last_copy_removed() -> None:
    residency = ExactResidency()
    await residency.stored(W, [5, 5])
    await residency.removed(W, [5])
    assert residency.contains(W, 5)
    await residency.removed(W, [5, 6])
    assert not residency.contains(W, 5) and len(residency) == 0


async def test_gap_without_replay_clears_the_worker() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    residency = ExactResidency()
    async with FakePublisher(endpoint) as pub:
        sub = KVEventSubscriber(W, endpoint, residency, topic="kv")
        async with subscribed(sub):
            await synced(pub, sub)
            await pub.publish([stored([1, 2])])
            await until(lambda: len(residency) == 2)
            gaps = sub.stats.gaps
            await pub.publish([stored([3])], drop=True)
            await pub.publish([stored([4])])
            await until(lambda: sub.stats.gaps == gaps + 1)
            await until(lambda: residency.resident(W) == {4})


async def test_gap_with_replay_is_repaired_in_order() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    replay = f"tcp://127.0.0.1:{free_port()}"
    residency = ExactResidency()
    async with FakePublisher(endpoint, replay) as pub:
        # Published before anyone listens: only the replay buffer has it.
        await pub.publish([stored([10, 11])])
        sub = KVEventSubscriber(W, endpoint, residency, topic="kv", replay_endpoint=replay)
        async with subscribed(sub):
            await synced(pub, sub)
            await until(lambda: residency.contains(W, 10))
            resets = sub.stats.resets
            await pub.publish([stored([1, 2, 3])], drop=True)
            await pub.publish([removed([2])], drop=True)
            await pub.publish([stored([4])])
            await until(lambda: residency.contains(W, 4))
            assert residency.resident(W) == {10, 11, 1, 3, 4}
            assert sub.stats.resets == resets and sub.stats.replayed >= 2


async def test_replay_buffer_overrun_falls_back_to_clear() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    replay = f"tcp://127.0.0.1:{free_port()}"
    residency = ExactResidency()
    async with FakePublisher(endpoint, replay, buffer_steps=2) as pub:
        sub = KVEventSubscriber(W, endpoint, residency, topic="kv", replay_endpoint=replay)
        async with subscribed(sub):
            await synced(pub, sub)
            await pub.publish([stored([1])])
            await until(lambda: residency.contains(W, 1))
            for block in (2, 3, 4):
                await pub.publish([stored([block])], drop=True)
            await pub.publish([stored([5])])
            await until(lambda: residency.contains(W, 5))
            assert residency.resident(W) == {5}


async def test_joining_late_replays_the_buffer_before_any_live_batch() -> None:
    """A subscriber started after the worker cached blocks knows them from the replay alone:
    nothing is published after it joins."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    replay = f"tcp://127.0.0.1:{free_port()}"
    residency = ExactResidency()
    async with FakePublisher(endpoint, replay) as pub:
        await pub.publish([stored([1, 2, 3])])
        await pub.publish([removed([2]), stored([4])])
        sub = KVEventSubscriber(W, endpoint, residency, topic="kv", replay_endpoint=replay)
        async with subscribed(sub):
            await until(lambda: residency.resident(W) == {1, 3, 4})
            assert sub.stats.replayed == 2 and sub.stats.resets == 0
            # the next live batch continues the sequence: no gap, no second replay
            await pub.joined()
            await pub.publish([stored([5])])
            await until(lambda: residency.contains(W, 5))
            assert sub.stats.gaps == 0 and sub.stats.replayed == 2


async def test_a_live_copy_of_a_replayed_batch_is_applied_once() -> None:
    """A batch published while the catch-up runs arrives twice (replayed and queued on SUB):
    applied twice, a block stored once would need two removals to go."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    replay = f"tcp://127.0.0.1:{free_port()}"
    residency = ExactResidency()
    async with FakePublisher(endpoint, replay) as pub:
        await pub.publish([stored([7])])
        sub = KVEventSubscriber(W, endpoint, residency, topic="kv", replay_endpoint=replay)
        assert await sub.catch_up()
        seq, payload = pub.buffer[0]
        await sub.handle(decode_message([b"kv", seq.to_bytes(8, "big"), payload]))
        await sub.handle(decode_message([b"kv", (seq + 1).to_bytes(8, "big"),
                                         msgpack.packb([time.time(), [removed([7])], 0])]))
        assert not residency.contains(W, 7)
        assert sub.stats.resets == 0 and sub.stats.gaps == 0


async def test_catch_up_without_an_answer_leaves_live_events_to_do_the_work() -> None:
    """A replay endpoint nobody serves: the catch-up gives up after its timeout and the
    subscriber still follows live batches."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    residency = ExactResidency()
    async with FakePublisher(endpoint) as pub:
        sub = KVEventSubscriber(W, endpoint, residency, topic="kv",
                                replay_endpoint=f"tcp://127.0.0.1:{free_port()}",
                                replay_timeout_s=0.2)
        async with subscribed(sub):
            await synced(pub, sub)
            await pub.publish([stored([3])])
            await until(lambda: residency.contains(W, 3))


async def test_publisher_restart_resets_and_reconnects() -> None:
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    residency = ExactResidency()
    sub = KVEventSubscriber(W, endpoint, residency, topic="kv")
    async with subscribed(sub):
        async with FakePublisher(endpoint) as pub:
            await synced(pub, sub)
            for _ in range(5):
                await pub.publish([])
            await pub.publish([stored([1, 2])])
            await until(lambda: len(residency) == 2)
        # vLLM restarts on the same port: sequence from 0, cache empty.
        async with FakePublisher(endpoint) as pub:
            deadline = time.monotonic() + 10
            while not residency.contains(W, 9):
                assert time.monotonic() < deadline, "no events after the publisher restarted"
                await pub.publish([stored([9])])
                await asyncio.sleep(0.05)
            assert sub.stats.resets >= 1
            assert not residency.contains(W, 1)


async def test_offload_tier_events_land_in_the_offload_tier_and_weigh_in_the_prediction(
        ) -> None:
    """vLLM/LMCache announce offloaded blocks with medium "CPU": the router's subscriber
    keeps them apart from GPU residency, and the residency signal counts them at the
    offload weight after the GPU hit."""
    from router.fleet.workers import Worker
    from router.protocol.kv_contract import ALL_MEDIA
    from router.residency.memory import MemoryResidency
    from router.routing.candidate import Candidate
    from router.routing.keys import RoutingKey
    from router.routing.request import RoutingRequest
    from router.routing.signals.base import SignalContext
    from router.routing.signals.residency import ResidencySignal

    endpoint = f"tcp://127.0.0.1:{free_port()}"
    residency = ExactResidency()
    async with FakePublisher(endpoint) as pub:
        sub = KVEventSubscriber(W, endpoint, residency, topic="kv", media=ALL_MEDIA)
        async with subscribed(sub):
            await synced(pub, sub)
            await pub.publish([stored([1, 2]), stored([3, 4], medium="CPU")])
            await until(lambda: residency.match_offloaded(W, [1, 2, 3, 4, 5], 2) == 2)
            assert residency.match(W, [1, 2, 3, 4]) == 2  # GPU hit unchanged
            await pub.publish([removed([4], medium="CPU")])
            await until(lambda: residency.match_offloaded(W, [1, 2, 3, 4], 2) == 1)

    class Exact:  # the two calls PreciseMatcher makes, on the real exact residency
        def match(self, chain: list[int], ids: list[str]) -> dict[str, int]:
            return {w: n for w in ids if (n := residency.match(w, chain))}

        def offloaded(self, chain: list[int], gpu: dict[str, int], ids: list[str]
                      ) -> dict[str, int]:
            return {w: n for w in ids
                    if (n := residency.match_offloaded(w, chain, gpu.get(w, 0)))}

    signal = ResidencySignal(SignalContext(MemoryResidency(), exact=Exact(),  # type: ignore[arg-type]
                                           offload_weight=0.5))
    chain = tuple(i.to_bytes(8, "big") for i in (1, 2, 3, 9))
    request = RoutingRequest(RoutingKey("k", chain), prompt_tokens=16 * 4 + 8,
                             tokens_per_block=16, exact=True)
    here, elsewhere = Candidate(Worker(id=W, url="http://w")), Candidate(Worker(id="o", url=""))
    await signal.annotate(request, [here, elsewhere])
    assert (here.matched_blocks, here.offloaded_blocks) == (2, 1)
    assert here.cached_tokens == 2 * 16 + 0.5 * 16  # GPU blocks, then half an offloaded one
    assert elsewhere.cached_tokens == 0
