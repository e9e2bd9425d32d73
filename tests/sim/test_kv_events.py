"""KV events over ZMQ decode with pyzmq + msgpack and carry recomputable block hashes."""

from __future__ import annotations

import asyncio
import hashlib

import cbor2
import msgpack
import zmq

from engine_worker.sim import Engine, EngineConfig, VirtualClock
from engine_worker.sim.kv_events import ZmqKVEventPublisher
from tests.support import free_port


def recompute(tokens: list[int], parent: bytes | None, seed: str, bs: int = 16) -> list[bytes]:
    """vLLM's sha256_cbor chain, written out from scratch."""
    root = hashlib.sha256(cbor2.dumps(seed, canonical=True)).digest()
    out = []
    for i in range(0, len(tokens), bs):
        data = cbor2.dumps((parent or root, tuple(tokens[i:i + bs]), None), canonical=True)
        parent = hashlib.sha256(data).digest()
        out.append(parent)
    return out


def receive(sub: zmq.Socket, timeout_ms: int = 5000) -> list:
    assert sub.poll(timeout_ms), "no KV event batch arrived"
    topic, seq, payload = sub.recv_multipart()
    batch = msgpack.unpackb(payload, raw=False)
    return [topic, int.from_bytes(seq, "big"), batch]


async def test_block_stored_hashes_match_recomputed_hashes() -> None:
    port = free_port()
    publisher = ZmqKVEventPublisher(f"tcp://*:{port}", topic="kv")
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(f"tcp://127.0.0.1:{port}")
    engine = Engine("tiny@l4", EngineConfig(num_gpu_blocks=8, hash_seed="42"), VirtualClock(),
                    kv_listeners=[publisher.on_event])
    try:
        # PUB/SUB joins are asynchronous: publish until the subscriber sees something.
        first = None
        for attempt in range(50):
            await engine.generate([attempt + 1000] * 17, max_tokens=1)
            if sub.poll(100):
                first = sub.recv_multipart()
                break
        assert first is not None
        while sub.poll(200):
            sub.recv_multipart()
        prompt = list(range(1, 50))  # 3 full blocks + 1 token
        await engine.generate(prompt, max_tokens=1)
        topic, seq, batch = receive(sub)
        assert topic == b"kv" and seq > 0
        ts, events, dp_rank = batch
        assert isinstance(ts, float) and dp_rank == 0
        stored = [e for e in events if e["type"] == "BlockStored"]
        assert len(stored) == 1
        ev = stored[0]
        assert ev["block_size"] == 16 and ev["medium"] == "GPU"
        assert ev["parent_block_hash"] is None and ev["token_ids"] == prompt[:48]
        assert ev["block_hashes"] == recompute(ev["token_ids"], None, "42")
        # Overflow the 8-block cache: old blocks are evicted and reported.
        await engine.generate(list(range(200, 300)), max_tokens=1)
        _, _, (_, events, _) = receive(sub)
        removed = [h for e in events if e["type"] == "BlockRemoved" for h in e["block_hashes"]]
        known = set(ev["block_hashes"])
        for attempt in range(50):
            known |= set(recompute([attempt + 1000] * 16, None, "42"))
        assert removed and set(removed) <= known
    finally:
        await engine.stop()
        publisher.close()
        sub.close(linger=0)
        ctx.term()


def test_array_format_matches_legacy_vllm_layout() -> None:
    from engine_worker.sim.events import AllBlocksCleared, BlockRemoved, BlockStored
    from engine_worker.sim.kv_events import encode_batch

    payload = encode_batch([BlockStored([b"h1"], None, [1, 2], 2), BlockRemoved([b"h1"]),
                            AllBlocksCleared()], 1.5, fmt="array")
    assert msgpack.unpackb(payload) == [1.5, [["BlockStored", [b"h1"], None, [1, 2], 2, None,
                                              "GPU"], ["BlockRemoved", [b"h1"], "GPU"],
                                             ["AllBlocksCleared"]], 0]


def replay_request(endpoint: str, start: int, timeout_ms: int = 5000) -> list[list[bytes]]:
    """vLLM's replay request from a DEALER: [b"", start as 8 bytes]; frames up to the -1."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        sock.send_multipart([b"", start.to_bytes(8, "big")])
        out = []
        while True:
            assert sock.poll(timeout_ms), "replay socket did not answer"
            frames = sock.recv_multipart()
            out.append(frames)
            if int.from_bytes(frames[1], "big", signed=True) == -1:
                return out
    finally:
        sock.close(linger=0)
        ctx.term()


async def test_replay_socket_answers_as_vllm_does() -> None:
    """Batches published with nobody listening come back from the ROUTER socket, from the
    requested sequence number on, then the end marker (-1, empty payload)."""
    replay = f"tcp://127.0.0.1:{free_port()}"
    publisher = ZmqKVEventPublisher(f"tcp://*:{free_port()}", topic="kv",
                                    replay_endpoint=replay, buffer_steps=3)
    engine = Engine("tiny@l4", EngineConfig(num_gpu_blocks=64, hash_seed="0"), VirtualClock(),
                    kv_listeners=[publisher.on_event])
    try:
        for first in (1, 100, 200, 300):  # four steps storing blocks: four batches
            await engine.generate(list(range(first, first + 33)), max_tokens=1)
        await asyncio.sleep(0)  # the last step's batch is flushed by a loop callback
        everything = replay_request(replay, 0)
        *batches, end = everything
        assert end == [b"", (-1).to_bytes(8, "big", signed=True), b""]
        seqs = [int.from_bytes(f[1], "big") for f in batches]
        assert len(seqs) == 3 and seqs == list(range(seqs[0], seqs[0] + 3)), \
            "the buffer keeps the last buffer_steps batches, in order"
        _, events, _ = msgpack.unpackb(batches[-1][2], raw=False)
        stored = [e for e in events if e["type"] == "BlockStored"]
        assert stored and stored[-1]["token_ids"][:3] == [300, 301, 302]
        later = replay_request(replay, seqs[-1])
        assert [int.from_bytes(f[1], "big", signed=True) for f in later] == [seqs[-1], -1]
    finally:
        await engine.stop()
        publisher.close()
