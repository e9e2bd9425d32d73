"""A stand-in for vLLM's ZmqEventPublisher, speaking its wire protocol byte for byte.

PUB: [topic, seq (8-byte big-endian), msgpack EventBatch [ts, [events], dp_rank]].
ROUTER replay: a request [identity, b"", start_seq] is answered with one
[identity, b"", seq, payload] per buffered batch with seq >= start_seq, then
[identity, b"", -1 (8 bytes, signed), b""]. Events are msgspec tagged structs: maps with a
"type" key (vLLM 0.32) or, with array_like=True, arrays led by the tag (older vLLM).
Tests can drop a batch from the PUB stream (it still lands in the replay buffer), restart
the sequence, or shrink the buffer, to exercise the subscriber's gap handling.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import msgpack
import zmq
import zmq.asyncio

END_SEQ = (-1).to_bytes(8, "big", signed=True)


def stored(hashes: list[Any], medium: str | None = "GPU", parent: Any = None,
           array_like: bool = False, block_size: int = 16) -> Any:
    tokens = list(range(block_size * len(hashes)))
    if array_like:
        return ["BlockStored", hashes, parent, tokens, block_size, None, medium, None]
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "token_ids": tokens, "block_size": block_size, "lora_id": None, "medium": medium,
            "lora_name": None}


def removed(hashes: list[Any], medium: str | None = "GPU", array_like: bool = False) -> Any:
    if array_like:
        return ["BlockRemoved", hashes, medium]
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium}


def cleared(array_like: bool = False) -> Any:
    return ["AllBlocksCleared"] if array_like else {"type": "AllBlocksCleared"}


class FakePublisher:
    def __init__(self, endpoint: str, replay_endpoint: str | None = None, topic: str = "kv",
                 buffer_steps: int = 10_000) -> None:
        self._ctx = zmq.asyncio.Context()
        self.pub = self._ctx.socket(zmq.XPUB)  # PUB on the wire; also reports subscriptions
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind(endpoint)
        self.replay = None
        if replay_endpoint:
            self.replay = self._ctx.socket(zmq.ROUTER)
            self.replay.setsockopt(zmq.LINGER, 0)
            self.replay.bind(replay_endpoint)
        self.topic = topic.encode()
        self.seq = 0
        self.buffer: list[tuple[int, bytes]] = []
        self.buffer_steps = buffer_steps
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> FakePublisher:
        if self.replay is not None:
            self._task = asyncio.create_task(self._serve_replay())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.pub.close(linger=0)
        if self.replay is not None:
            self.replay.close(linger=0)
        self._ctx.term()

    async def joined(self, within_s: float = 5.0) -> None:
        """Wait until a subscription reaches this publisher. ZMQ drops what is published
        before a subscriber has joined, and a test whose last live batch is dropped that way
        has nothing after it to show the gap."""
        while True:
            if not await self.pub.poll(int(within_s * 1000)):
                raise AssertionError("no subscriber joined")
            if (await self.pub.recv())[:1] == b"\x01":
                return

    async def publish(self, events: list[Any], drop: bool = False) -> int:
        """Send one batch (or only buffer it, as if PUB dropped it); its sequence number."""
        seq = self.seq
        self.seq += 1
        payload = msgpack.packb([time.time(), events, 0], use_bin_type=True)
        self.buffer = [*self.buffer, (seq, payload)][-self.buffer_steps:]
        if not drop:
            await self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
        return seq

    async def _serve_replay(self) -> None:
        assert self.replay is not None
        while True:
            identity, _, start = await self.replay.recv_multipart()
            first = int.from_bytes(start, "big")
            for seq, payload in self.buffer:
                if seq >= first:
                    await self.replay.send_multipart(
                        [identity, b"", seq.to_bytes(8, "big"), payload])
            await self.replay.send_multipart([identity, b"", END_SEQ, b""])
