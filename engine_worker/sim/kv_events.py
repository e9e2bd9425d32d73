"""KV events over ZMQ PUB in vLLM's wire format.

Each engine step's events go out as one multipart message
``[topic, seq (8-byte big-endian), msgpack(EventBatch)]`` where EventBatch is the array
``[ts, [event, ...], data_parallel_rank]`` (msgspec ``array_like``). Events are msgspec
tagged structs. Current vLLM encodes them as maps tagged by ``type``
(``{"type": "BlockStored", "block_hashes": [...], ...}``); vLLM releases up to ~0.10
encoded them array-like (``["BlockStored", block_hashes, parent_block_hash, token_ids,
block_size, lora_id, medium]``). ``--kv-events-format`` picks one (default: map).
Block hashes are the raw 32-byte digests, or their low 64 bits as ints when
``int_hashes`` is set (vLLM's VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES).

Replay, as vLLM's ZmqEventPublisher serves it (``replay_endpoint``, a ROUTER socket): the
last ``buffer_steps`` batches are kept; a request ``[identity, b"", start_seq]`` (8-byte
big-endian) is answered with one ``[identity, b"", seq, payload]`` per buffered batch with
``seq >= start_seq``, then ``[identity, b"", -1 (8 bytes, signed), b""]``. A subscriber that
joins late (a router started after this worker cached a prefix) or missed batches asks it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from collections import deque
from typing import Any

import msgpack
import zmq

from engine_worker.sim.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from engine_worker.sim.hashing import to_external


def encode_event(event: KVEvent, fmt: str = "map", int_hashes: bool = False) -> Any:
    """One event as msgspec would encode vLLM's struct (before msgpack)."""
    def ext(h: bytes | None) -> bytes | int | None:
        return None if h is None else to_external(h, int_hashes)

    if isinstance(event, BlockStored):
        fields: dict[str, Any] = {
            "block_hashes": [ext(h) for h in event.block_hashes],
            "parent_block_hash": ext(event.parent_block_hash),
            "token_ids": list(event.token_ids),
            "block_size": event.block_size,
            "lora_id": None,
            "medium": event.medium,
        }
        if fmt == "map":
            fields["lora_name"] = None
        tag = "BlockStored"
    elif isinstance(event, BlockRemoved):
        fields = {"block_hashes": [ext(h) for h in event.block_hashes], "medium": event.medium}
        tag = "BlockRemoved"
    elif isinstance(event, AllBlocksCleared):
        fields, tag = {}, "AllBlocksCleared"
    else:  # pragma: no cover - exhaustive
        raise TypeError(event)
    if fmt == "array":
        return [tag, *fields.values()]
    return {"type": tag, **fields}


def encode_batch(events: list[KVEvent], ts: float, fmt: str = "map",
                 int_hashes: bool = False, dp_rank: int = 0) -> bytes:
    return msgpack.packb([ts, [encode_event(e, fmt, int_hashes) for e in events], dp_rank],
                         use_bin_type=True)


END_SEQ = (-1).to_bytes(8, "big", signed=True)


def _binds(endpoint: str) -> bool:
    """vLLM's heuristic: bind a wildcard or local transport, else connect."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class ZmqKVEventPublisher:
    """Buffers the events of one step and publishes them as one batch (non-blocking PUB);
    with ``replay_endpoint``, also answers replay requests for the last ``buffer_steps``."""

    def __init__(self, endpoint: str, topic: str = "", fmt: str = "map",
                 int_hashes: bool = False, replay_endpoint: str | None = None,
                 buffer_steps: int = 10_000) -> None:
        if fmt not in ("map", "array"):
            raise ValueError("kv events format must be 'map' or 'array'")
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PUB)
        self._sock.set_hwm(100_000)
        if _binds(endpoint):
            self._sock.bind(endpoint)
        else:
            self._sock.connect(endpoint)
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self._topic = topic.encode()
        self._fmt = fmt
        self._int = int_hashes
        self._seq = itertools.count()
        self._pending: list[KVEvent] = []
        # (seq, payload) of the last batches; appended on the loop, read by the replay thread
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._lock = threading.Lock()
        self._running = True
        self._replay_thread: threading.Thread | None = None
        if replay_endpoint:
            replay = self._ctx.socket(zmq.ROUTER)
            replay.setsockopt(zmq.LINGER, 0)
            replay.bind(replay_endpoint)  # vLLM always binds its replay socket
            # A thread, as vLLM's publisher thread: replies never wait on the engine's loop.
            self._replay_thread = threading.Thread(target=self._serve_replay, args=(replay,),
                                                   name="kv-events-replay", daemon=True)
            self._replay_thread.start()

    def on_event(self, event: KVEvent) -> None:
        """KV cache listener: flushed at the end of the current synchronous step."""
        if not self._pending:
            try:
                asyncio.get_running_loop().call_soon(self.flush)
            except RuntimeError:  # no loop (direct use in a thread): publish now
                self._pending.append(event)
                self.flush()
                return
        self._pending.append(event)

    def flush(self) -> None:
        if not self._pending:
            return
        events, self._pending = self._pending, []
        payload = encode_batch(events, time.time(), self._fmt, self._int)
        seq = next(self._seq)
        with self._lock:
            self._buffer.append((seq, payload))
        # A slow subscriber makes PUB drop, as vLLM's would at the high-water mark.
        with contextlib.suppress(zmq.Again):
            self._sock.send_multipart((self._topic, seq.to_bytes(8, "big"), payload),
                                      flags=zmq.NOBLOCK)

    def _serve_replay(self, replay: zmq.Socket) -> None:
        """Answer replay requests until closed (the socket lives in this thread only)."""
        try:
            while self._running:
                if not replay.poll(100):
                    continue
                frames = replay.recv_multipart()
                if len(frames) != 3:  # vLLM logs and ignores a malformed request
                    continue
                client, _, start = frames
                first = int.from_bytes(start, "big")
                with self._lock:
                    batches = [(seq, buf) for seq, buf in self._buffer if seq >= first]
                for seq, buf in batches:
                    replay.send_multipart((client, b"", seq.to_bytes(8, "big"), buf))
                replay.send_multipart((client, b"", END_SEQ, b""))
        finally:
            replay.close(linger=0)

    def close(self) -> None:
        self.flush()
        self._running = False
        if self._replay_thread is not None:
            self._replay_thread.join()
        self._sock.close(linger=0)
        self._ctx.term()
