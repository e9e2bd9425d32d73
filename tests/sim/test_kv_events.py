"""KV events over ZMQ decode with pyzmq + msgpack and carry recomputable block hashes."""

from __future__ import annotations

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
