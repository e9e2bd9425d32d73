"""``prefix-sim`` / ``python -m engine_worker.sim``: run one simulated vLLM server."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import ssl
from collections.abc import Sequence

from aiohttp import web

from engine_worker.config import public_endpoint
from engine_worker.sim.clock import ScaledClock
from engine_worker.sim.engine import Engine
from engine_worker.sim.engine_config import EngineConfig
from engine_worker.sim.profiles import load_profile
from engine_worker.sim.server import Faults, SimServer
from engine_worker.sim.tokenizer import load_tokenizer
from router.protocol.registry import API_KEY_FINGERPRINT, key_fingerprint

log = logging.getLogger("prefix_sim")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="prefix-sim", description=__doc__)
    a = p.add_argument
    a("--host", default="127.0.0.1")
    a("--port", type=int, default=8000)
    a("--model", default="sim-model", help="served model name")
    a("--profile", default="llama-3-8b@h100-80gb", help="MODEL@GPU from profiles.yaml")
    a("--tokenizer", default=None, help="local Hugging Face tokenizer directory (optional)")
    a("--block-size", type=int, default=16)
    a("--num-gpu-blocks", type=int, default=None, help="default: derived from the profile")
    a("--gpu-memory-utilization", type=float, default=0.9)
    a("--max-num-seqs", type=int, default=256)
    a("--max-num-batched-tokens", type=int, default=8192)
    a("--max-model-len", type=int, default=None)
    a("--preemption-mode", choices=["recompute", "swap"], default="recompute")
    a("--cpu-offload-gb", type=float, default=0.0, help="LMCache-like CPU tier size")
    a("--prefix-caching-hash-algo", choices=["sha256", "sha256_cbor"], default="sha256_cbor")
    a("--time-scale", type=float, default=1.0, help="real seconds per simulated second")
    a("--kv-events-endpoint", default=None, help="e.g. tcp://*:5557 (off by default)")
    a("--kv-events-replay-endpoint", default=None,
      help="ZMQ ROUTER endpoint answering replay requests, e.g. tcp://*:5558 (vLLM's)")
    a("--kv-events-buffer-steps", type=int, default=10_000, help="batches kept for replay")
    a("--kv-events-topic", default="")
    a("--kv-events-format", choices=["map", "array"], default="map")
    a("--kv-events-int-hashes", action="store_true")
    a("--fail-rate", type=float, default=0.0)
    a("--fail-after", type=int, default=0)
    a("--stall-ms", type=float, default=0.0)
    a("--seed", type=int, default=0)
    a("--register-redis", default=None, help="redis URL to register this worker in")
    a("--worker-id", default=None, help="default: sim-<port>")
    a("--advertise-url", default=None, help="default: http://host:port")
    a("--api-key", default=None,
      help="as vLLM's: every route but /health, /metrics, /version... needs "
           "'Authorization: Bearer KEY' (default: $VLLM_API_KEY, as vLLM reads it)")
    a("--ssl-certfile", default=None, help="serve HTTPS with this PEM certificate (vLLM's)")
    a("--ssl-keyfile", default=None, help="... and this PEM private key")
    a("--drain-timeout", type=float, default=30.0)
    a("--log-level", default="INFO")
    return p


def server_tls(certfile: str | None, keyfile: str | None) -> ssl.SSLContext | None:
    """The HTTPS context of ``--ssl-certfile``/``--ssl-keyfile`` (None: plain HTTP)."""
    if not certfile:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certfile, keyfile)
    return context


def record_extra(args: argparse.Namespace, profile: str, url: str,
                 api_key: str | None = None) -> dict[str, str]:
    """What routers need beyond the record's fields to follow this worker's KV events
    (the keys prefix-worker writes for real vLLM)."""
    extra = {"profile": profile, "engine": "prefix-sim",
             "hash_algo": args.prefix_caching_hash_algo, "kv_events_topic": args.kv_events_topic}
    if (seed := os.environ.get("PYTHONHASHSEED")) is not None:
        extra["hash_seed"] = seed  # unset: the engine's hashes are random, nothing matches
    if api_key:  # its fingerprint, never the key: routers hold the keys themselves
        extra[API_KEY_FINGERPRINT] = key_fingerprint(api_key)
    if args.kv_events_replay_endpoint:
        extra["kv_events_replay_endpoint"] = public_endpoint(args.kv_events_replay_endpoint, url)
    return extra


async def serve(args: argparse.Namespace) -> None:
    profile = load_profile(args.profile)
    config = EngineConfig(model_name=args.model, block_size=args.block_size,
                          num_gpu_blocks=args.num_gpu_blocks,
                          gpu_memory_utilization=args.gpu_memory_utilization,
                          max_num_seqs=args.max_num_seqs,
                          max_num_batched_tokens=args.max_num_batched_tokens,
                          max_model_len=args.max_model_len,
                          preemption_mode=args.preemption_mode,
                          cpu_offload_gb=args.cpu_offload_gb,
                          hash_algo=args.prefix_caching_hash_algo, seed=args.seed)
    engine = Engine(profile, config, ScaledClock(args.time_scale))
    publisher = None
    if args.kv_events_endpoint:
        from engine_worker.sim.kv_events import ZmqKVEventPublisher

        publisher = ZmqKVEventPublisher(args.kv_events_endpoint, args.kv_events_topic,
                                        args.kv_events_format, args.kv_events_int_hashes,
                                        replay_endpoint=args.kv_events_replay_endpoint,
                                        buffer_steps=args.kv_events_buffer_steps)
        engine.add_kv_listener(publisher.on_event)
    tokenizer = load_tokenizer(args.tokenizer, profile.model.vocab)
    api_key = args.api_key or os.environ.get("VLLM_API_KEY") or None
    sources = [{"data_parallel_rank": 0, "endpoint": args.kv_events_endpoint,
                "replay_endpoint": args.kv_events_replay_endpoint,
                "topic": args.kv_events_topic}] if args.kv_events_endpoint else []
    server = SimServer(engine, tokenizer, Faults(args.fail_rate, args.fail_after, args.stall_ms),
                       args.seed, api_key=api_key, kv_event_sources=sources)
    runner = web.AppRunner(server.app(), access_log=None)
    await runner.setup()
    tls = server_tls(args.ssl_certfile, args.ssl_keyfile)
    await web.TCPSite(runner, args.host, args.port, ssl_context=tls).start()
    scheme = "https" if tls is not None else "http"
    url = args.advertise_url or f"{scheme}://{args.host}:{args.port}"
    registration = None
    if args.register_redis:
        from engine_worker.registration import Registration
        from router.protocol.registry import WorkerRecord

        record = WorkerRecord(id=args.worker_id or f"sim-{args.port}", url=url,
                              models=(args.model,), block_size=args.block_size,
                              capacity_blocks=engine.num_gpu_blocks,
                              kv_events_endpoint=public_endpoint(args.kv_events_endpoint or "",
                                                                 url),
                              extra=record_extra(args, profile.name, url, api_key))
        registration = Registration(args.register_redis, record)
        await registration.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info("prefix-sim ready on http://%s:%s (model %s, profile %s, %d GPU blocks)",
             args.host, args.port, args.model, profile.name, engine.num_gpu_blocks)
    await stop.wait()
    log.info("prefix-sim draining")
    if registration is not None:
        with contextlib.suppress(Exception):
            await registration.drain()
    await server.drain(args.drain_timeout)
    if registration is not None:
        await registration.stop()
    await runner.cleanup()
    await engine.stop()
    if publisher is not None:
        publisher.close()
    log.info("prefix-sim stopped")


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(message)s")
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
