"""Run one vLLM worker: start it, wait for health, register it, drain it on SIGTERM.

Lifecycle, and why each step is where it is:
1. start vLLM in its own session, so a Ctrl-C or SIGTERM to this launcher's process group
   reaches only the launcher, which drains first; the child gets PR_SET_PDEATHSIG so a
   SIGKILLed launcher never leaves an orphaned vLLM holding the GPU;
2. wait for GET /health (model load can take minutes: bounded by health_timeout_s);
3. read the KV capacity from /metrics and register in Redis (heartbeat with TTL) only then,
   so routers never see a worker that can't serve;
4. on SIGTERM/SIGINT: set the registry's draining flag (routers stop sending), wait until
   vLLM reports no running or waiting requests (at least drain_grace_s, so routers have
   seen the flag, at most drain_timeout_s), deregister, SIGTERM vLLM (SIGKILL after
   stop_timeout_s), and exit with vLLM's status; a second signal skips the wait;
5. if vLLM dies on its own, deregister at once and exit with its status.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import time

import aiohttp

from engine_worker import vllm_check
from engine_worker.command import VllmCommand, build
from engine_worker.config import WorkerConfig
from engine_worker.registration import Registration
from router.protocol import registry, vllm_metrics
from router.protocol.registry import WorkerRecord

log = logging.getLogger(__name__)
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the launcher dies (Linux only)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def local_endpoint(endpoint: str) -> str:
    """How this host dials a ZMQ endpoint vLLM binds: a wildcard host becomes 127.0.0.1."""
    if not endpoint.startswith("tcp://"):
        return endpoint
    host, _, port = endpoint[len("tcp://"):].rpartition(":")
    if host in ("*", "0.0.0.0", "::", "[::]"):
        host = "127.0.0.1"
    return f"tcp://{host}:{port}"


def exit_status(returncode: int) -> int:
    """A shell's view of a child's status: 128+N for death by signal N."""
    return 128 - returncode if returncode < 0 else returncode


class Launcher:
    """Owns one vLLM process and its registry entry for the process's whole life."""

    def __init__(self, config: WorkerConfig, check_vllm: bool = True) -> None:
        self.config = config
        self.command: VllmCommand = build(config)
        # Only a worker that publishes KV events is read hash by hash by the routers.
        self._check_vllm = check_vllm and bool(config.kv_events_endpoint)
        self._proc: asyncio.subprocess.Process | None = None
        self._registration: Registration | None = None
        self._register_task: asyncio.Task[None] | None = None
        self._exact_task: asyncio.Task[None] | None = None
        self._signals = 0
        self._stop = asyncio.Event()
        self._urgent = asyncio.Event()

    def request_stop(self) -> None:
        """Signal handler: the first call drains, the second stops without waiting."""
        self._signals += 1
        if self._signals > 1:
            self._urgent.set()
        self._stop.set()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
                return await self._run(http)
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)

    async def _run(self, http: aiohttp.ClientSession) -> int:
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *self.command.argv, env={**os.environ, **self.command.env},
                start_new_session=True, preexec_fn=_die_with_parent,
            )
        except OSError as exc:
            log.error("cannot start vLLM with %s: %s", self.command.argv[0], exc)
            return 127
        log.info("started vLLM pid=%d: %s", self._proc.pid, " ".join(self.command.argv))
        exited = asyncio.ensure_future(self._proc.wait())
        # The check imports vLLM (seconds to minutes): while the engine loads, not before.
        checked = asyncio.ensure_future(asyncio.to_thread(
            vllm_check.verify, self.config.python, self.config.python_hash_seed)
            if self._check_vllm else asyncio.sleep(0))
        try:
            if not await self._wait_healthy(http, exited):
                checked.cancel()
                return await self._shutdown(exited)
            try:
                await checked
            except vllm_check.UnknownVllm as exc:
                log.error("%s", exc)  # never registered: no router sees this worker
                await self._shutdown(exited)
                return vllm_check.REFUSED
            stats = await self._first_stats(http)
            log.info("vLLM healthy at %s: %s KV blocks of %d tokens", self.config.local_url,
                     stats.capacity_blocks, self.config.effective_block_size)
            if self.config.register_redis:
                self._register_task = asyncio.create_task(self._register(stats))
                if self.config.kv_events_endpoint:
                    self._exact_task = asyncio.create_task(self._publish_exact())
            stop = asyncio.ensure_future(self._stop.wait())
            await asyncio.wait({exited, stop}, return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            if exited.done():
                log.error("vLLM exited on its own with %s", exited.result())
            if not exited.done():
                await self._drain(http, exited)
            return await self._shutdown(exited)
        finally:
            # Engine-core children may outlive the API server; none may outlive us.
            self._kill_group(signal.SIGKILL)

    async def _wait_healthy(self, http: aiohttp.ClientSession, exited: asyncio.Future) -> bool:
        """True once /health answers 200; False if vLLM exits, a signal comes, or time is up."""
        deadline = time.monotonic() + self.config.health_timeout_s
        while time.monotonic() < deadline:
            if exited.done():
                log.error("vLLM exited with %s before it was healthy", exited.result())
                return False
            if self._stop.is_set():
                return False
            try:
                async with http.get(f"{self.config.local_url}/health") as resp:
                    if resp.status == 200:
                        return True
            except (TimeoutError, aiohttp.ClientError):
                pass
            await asyncio.sleep(0.5)
        log.error("vLLM not healthy after %.0f s", self.config.health_timeout_s)
        return False

    async def _stats(self, http: aiohttp.ClientSession) -> vllm_metrics.EngineStats | None:
        try:
            async with http.get(f"{self.config.local_url}/metrics") as resp:
                return vllm_metrics.parse(await resp.text()) if resp.status == 200 else None
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            log.warning("reading vLLM /metrics failed: %s", exc)
            return None

    async def _first_stats(self, http: aiohttp.ClientSession) -> vllm_metrics.EngineStats:
        """The capacity gauge appears with the first scrape after start-up; retry briefly."""
        for _ in range(20):
            stats = await self._stats(http)
            if stats is not None and stats.capacity_blocks is not None:
                return stats
            await asyncio.sleep(0.5)
        log.warning("no vllm:cache_config_info num_gpu_blocks; registering capacity 0")
        return vllm_metrics.EngineStats(None, None, 0, 0)

    def record(self, stats: vllm_metrics.EngineStats) -> WorkerRecord:
        config = self.config
        return WorkerRecord(
            id=config.effective_worker_id,
            url=config.public_url,
            models=config.models,
            block_size=stats.block_size or config.effective_block_size,
            capacity_blocks=stats.capacity_blocks or 0,
            kv_events_endpoint=config.public_kv_events_endpoint,
            extra={"engine": "vllm", "device": config.device,
                   "hash_algo": config.prefix_caching_hash_algo,
                   "hash_seed": config.python_hash_seed,
                   "kv_events_replay_endpoint": config.public_kv_events_replay_endpoint,
                   "kv_events_topic": config.kv_events_topic,
                   "lmcache_profile": os.path.basename(config.lmcache_profile or ""),
                   **({registry.API_KEY_FINGERPRINT: registry.key_fingerprint(config.api_key)}
                      if config.api_key else {})},
        )

    async def _register(self, stats: vllm_metrics.EngineStats) -> None:
        """Register, retrying while Redis is down: a worker must not die of a Redis outage."""
        assert self.config.register_redis is not None
        record = self.record(stats)
        delay = 0.5
        while not self._stop.is_set():
            registration = Registration(self.config.register_redis, record,
                                        ttl_s=self.config.heartbeat_ttl_s,
                                        prefix=self.config.registry_prefix)
            try:
                await registration.start()
            except Exception as exc:  # noqa: BLE001 - any Redis failure: retry with backoff
                log.warning("registering in redis failed (retrying in %.1fs): %s", delay, exc)
                with contextlib.suppress(Exception):
                    await registration.stop()
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
                continue
            self._registration = registration
            log.info("registered %s at %s", record.id, record.url)
            return

    async def _publish_exact(self) -> None:
        """Mirror this engine's KV events into Redis as ``{prefix}exact:{worker}``.

        Optional path (engine_worker/redis_sink.py): routers subscribe to the engine
        themselves; this set serves consumers that can't reach the ZMQ socket.
        """
        from engine_worker.redis_sink import RedisExactSink
        from router.infra.redis_client import make_client
        from router.protocol.kv_events import KVEventSubscriber

        config = self.config
        redis = make_client(config.register_redis or "")
        sub = KVEventSubscriber(
            config.effective_worker_id, local_endpoint(config.kv_events_endpoint or ""),
            RedisExactSink(redis, config.registry_prefix),
            replay_endpoint=local_endpoint(config.kv_events_replay_endpoint or "") or None,
            topic=config.kv_events_topic)
        try:
            while True:
                try:
                    await sub.run()
                except Exception as exc:  # noqa: BLE001 - Redis down: retry, never die
                    # The failed batch was not marked applied: the next one opens a gap, and
                    # the replay re-applies it (set writes are idempotent) or clears the set.
                    log.warning("mirroring kv events to redis failed (retrying): %s", exc)
                    await asyncio.sleep(1.0)
        finally:
            await redis.aclose()

    async def _drain(self, http: aiohttp.ClientSession, exited: asyncio.Future) -> None:
        """Stop new traffic, then let vLLM finish what it has (bounded)."""
        if self._register_task is not None:
            await _cancel(self._register_task)
        if self._registration is not None:
            try:
                await self._registration.drain()
            except Exception as exc:  # noqa: BLE001 - still drain locally
                log.warning("setting the draining flag failed: %s", exc)
        started = time.monotonic()
        log.info("draining: waiting for in-flight requests (max %.0fs)",
                 self.config.drain_timeout_s)
        while not exited.done() and not self._urgent.is_set():
            elapsed = time.monotonic() - started
            if elapsed >= self.config.drain_timeout_s:
                log.warning("drain timeout: stopping with requests in flight")
                return
            stats = await self._stats(http)
            if elapsed >= self.config.drain_grace_s and stats is not None \
                    and stats.in_flight == 0:
                log.info("drained after %.1fs", elapsed)
                return
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._urgent.wait(), 0.5)

    async def _shutdown(self, exited: asyncio.Future) -> int:
        """Deregister, stop vLLM (TERM, then KILL), and return the status to exit with."""
        if self._exact_task is not None:
            await _cancel(self._exact_task)
        if self._register_task is not None:
            await _cancel(self._register_task)
        if self._registration is not None:
            await self._registration.stop()
            self._registration = None
        if not exited.done():
            # vLLM's API server stops its engine-core children itself on SIGTERM.
            assert self._proc is not None
            self._proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.shield(exited), self.config.stop_timeout_s)
            except TimeoutError:
                log.warning("vLLM ignored SIGTERM for %.0fs: killing", self.config.stop_timeout_s)
                self._kill_group(signal.SIGKILL)
                await exited
        status = exit_status(exited.result())
        log.info("vLLM exited with status %d", status)
        return status

    def _kill_group(self, sig: int) -> None:
        """Signal vLLM and its engine-core children (they share its session's group)."""
        if self._proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, sig)


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def launch(config: WorkerConfig, check_vllm: bool = True) -> int:
    """Run a worker to completion; the process's exit status."""
    return await Launcher(config, check_vllm).run()
