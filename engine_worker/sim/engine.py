"""The simulated engine: a continuous-batching scheduler over the paged KV cache.

Each step, like vLLM v1's scheduler: running sequences first (decode 1 token, or the next
prefill chunk), then waiting ones, within ``max_num_seqs`` and a token budget of
``max_num_batched_tokens`` (chunked prefill). When blocks run out, the newest running
sequence is preempted: by recompute (blocks freed, re-queued at the front; its prefix is
usually still cached) or by swap (its KV is charged at PCIe bandwidth out and back in).
The step's duration comes from the roofline model and is slept on the engine's clock;
offline callers (bench/engine) drive it without a loop instead: ``add_request`` then
``step`` until idle, as with vLLM's ``LLMEngine``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import deque
from collections.abc import Callable, Sequence

from engine_worker.sim import textgen
from engine_worker.sim.clock import Clock, VirtualClock
from engine_worker.sim.cpu_tier import CpuTier
from engine_worker.sim.engine_config import EngineConfig, EngineCounters
from engine_worker.sim.events import KVEvent
from engine_worker.sim.hashing import BlockHasher
from engine_worker.sim.kv_cache import KVCacheManager
from engine_worker.sim.metrics import EngineMetrics
from engine_worker.sim.profiles import Profile, load_profile
from engine_worker.sim.request import Request, RequestHandle, RequestStats, Seq, TokenEvent
from engine_worker.sim.roofline import StepCost, step_seconds


class Engine:
    """One simulated vLLM engine. Usage: ``h = engine.submit(ids, 16); async for ev in h``."""

    def __init__(self, profile: Profile | str, config: EngineConfig | None = None,
                 clock: Clock | None = None,
                 kv_listeners: Sequence[Callable[[KVEvent], None]] = ()) -> None:
        self.profile = load_profile(profile) if isinstance(profile, str) else profile
        self.config = cfg = config or EngineConfig()
        if cfg.preemption_mode not in ("recompute", "swap"):
            raise ValueError("preemption_mode must be 'recompute' or 'swap'")
        if cfg.contiguous_reserve not in ("max", "request"):
            raise ValueError("contiguous_reserve must be 'max' or 'request'")
        self.clock: Clock = clock or VirtualClock()
        num_blocks = cfg.num_gpu_blocks or self.profile.num_gpu_blocks(
            cfg.block_size, cfg.gpu_memory_utilization)
        self.hasher = BlockHasher(cfg.block_size, cfg.hash_algo, cfg.hash_seed)
        block_bytes = cfg.block_size * self.profile.model.kv_bytes_per_token
        self.cpu_tier = CpuTier(int(cfg.cpu_offload_gb * 1e9 // block_bytes), cfg.block_size)
        listeners = list(kv_listeners)
        if self.cpu_tier.capacity_blocks:
            listeners.append(self.cpu_tier.on_gpu_event)
        self.kv = KVCacheManager(num_blocks, self.hasher, listeners,
                                 prefix_caching=cfg.enable_prefix_caching,
                                 allocation=cfg.kv_allocation)
        self.cpu_tier.emit = self.kv.publish  # the tier's events reach the same listeners
        self.max_model_len = cfg.max_model_len or self.profile.model.max_model_len
        self.metrics = EngineMetrics(cfg.model_name, cfg.block_size, num_blocks,
                                     cfg.enable_prefix_caching)
        self.counters = EngineCounters()
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self.sim_now = 0.0
        self._pending_swap_out: list[int] = []  # tokens of each sequence swapped out
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._ids = itertools.count()

    # -- public API ----------------------------------------------------------------
    @property
    def num_gpu_blocks(self) -> int:
        return self.kv.num_blocks

    def add_kv_listener(self, listener: Callable[[KVEvent], None]) -> None:
        self.kv.listeners.append(listener)

    def submit(self, prompt_token_ids: Sequence[int], max_tokens: int = 16, n: int = 1,
               request_id: str | None = None, cache_salt: str | None = None,
               lora: tuple[str, str] | None = None) -> RequestHandle:
        """Queue a request; iterate the handle for its TokenEvents (async)."""
        self._ensure_running()
        handle = self.add_request(prompt_token_ids, max_tokens, n, request_id, cache_salt, lora)
        self._wakeup.set()
        return handle

    def add_request(self, prompt_token_ids: Sequence[int], max_tokens: int = 16, n: int = 1,
                    request_id: str | None = None, cache_salt: str | None = None,
                    lora: tuple[str, str] | None = None,
                    arrival: float | None = None) -> RequestHandle:
        """Queue a request without starting the loop (offline use with ``step``). A
        cache_salt or a LoRA adapter (name, path) keys its blocks apart, as vLLM's extra
        keys do. ``arrival``: when it arrived, for a caller that steps the engine past it
        (the engine's clock already shows the end of the step it waits for)."""
        prompt = list(prompt_token_ids)
        if not prompt:
            raise ValueError("the prompt must have at least one token")
        if max_tokens < 1 or n < 1:
            raise ValueError("max_tokens and n must be >= 1")
        if len(prompt) + max_tokens > self.max_model_len:
            raise ValueError(f"prompt ({len(prompt)}) + max_tokens ({max_tokens}) exceeds "
                             f"max_model_len {self.max_model_len}")
        if -(-self._reservation(len(prompt), max_tokens) // self.config.block_size) \
                > self.kv.num_blocks:
            raise ValueError("the request can never fit in the KV cache")
        if n > 1 and self.kv.allocation == "contiguous":
            raise ValueError("n > 1 needs paged KV (contiguous allocation cannot share)")
        req = Request(request_id=request_id or f"sim-{next(self._ids)}", prompt=prompt,
                      prompt_hashes=self.hasher.chain(prompt, cache_salt=cache_salt, lora=lora),
                      max_tokens=max_tokens, n=n,
                      key=textgen.prompt_key(prompt),
                      stats=RequestStats(prompt_tokens=len(prompt),
                                         arrival=self._now() if arrival is None else arrival))
        req.live_seqs = 1
        self.waiting.append(Seq(req=req, index=0, tokens=list(prompt), hashes=req.prompt_hashes))
        self._update_gauges()
        return RequestHandle(req, self._abort)

    def step(self) -> float | None:
        """Run one step now, on simulated time only; its seconds, or None if idle."""
        scheduled, cost = self._schedule()
        if not scheduled and not cost.pcie_bytes:
            return None
        dt = step_seconds(self.profile, cost)
        self._complete(scheduled, dt)
        return dt

    async def generate(self, prompt_token_ids: Sequence[int], max_tokens: int = 16,
                       n: int = 1) -> tuple[list[TokenEvent], RequestStats]:
        """Submit and wait for the whole result."""
        handle = self.submit(prompt_token_ids, max_tokens, n)
        events = await handle.collect()
        return events, handle.stats

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    @property
    def num_running_requests(self) -> int:
        return len({id(s.req) for s in self.running})

    @property
    def num_waiting_requests(self) -> int:
        return len({id(s.req) for s in self.waiting})

    # -- loop ----------------------------------------------------------------------
    def _now(self) -> float:
        """A request's arrival: when it reached the engine, as vLLM stamps receipt. It
        joins the first step that starts at or after then (``_schedule``): stamped at the
        end of the step in progress, a request whose parse outlasted that step (the loop
        ran late behind it) was computed on the model's clock before it had arrived."""
        return max(self.sim_now, self.clock.now())

    def _ensure_running(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            if not self.running:
                if not self.waiting:
                    self._wakeup.clear()
                    await self._wakeup.wait()
                # an idle engine starts on the request's arrival, not when this loop got
                # round to it: the host's lateness is not the model's (as in a busy loop's
                # catch-up below)
                self.sim_now = max(self.sim_now, self.waiting[0].req.stats.arrival)
            scheduled, cost = self._schedule()
            if not scheduled and not cost.pcie_bytes:
                # Nothing fits (e.g. waiting on blocks held by nobody): should not happen.
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            dt = step_seconds(self.profile, cost)
            # the step ends dt after the last one did on the model's clock, not dt after
            # this loop got round to it: sleeping dt from a late wake-up (8 simulated
            # engines, a router and a load generator on 2 cores) put the engines behind
            # their model for as long as they stayed busy, 13-15 ms at p50 and 200+ at p99
            # of the first tokens on the live RAG bench, more for the busiest workers
            await self.clock.sleep_until(self.sim_now + dt)
            self._complete(scheduled, dt)

    def _complete(self, scheduled: list[tuple[Seq, int]], dt: float) -> None:
        self.sim_now += dt
        self.counters.steps += 1
        self._finish_step(scheduled)
        self._update_gauges()

    def _reservation(self, prompt_tokens: int, max_tokens: int) -> int:
        """Tokens of KV a request is given when it starts: in contiguous mode its whole
        reservation, else (paged) what it will ever hold."""
        if self.kv.allocation == "contiguous" and self.config.contiguous_reserve == "max":
            return self.max_model_len
        return prompt_tokens + max_tokens

    def _schedule(self) -> tuple[list[tuple[Seq, int]], StepCost]:
        cfg, kv, prof = self.config, self.kv, self.profile
        cost = StepCost()
        for tokens in self._pending_swap_out:
            cost.add_swap(prof, tokens, cfg.block_size)
        self._pending_swap_out.clear()
        budget = cfg.max_num_batched_tokens
        scheduled: list[tuple[Seq, int]] = []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(len(seq.tokens) - seq.num_computed, budget)
            while kv.blocks_needed(seq.seq_id, n) > kv.num_free_blocks:
                victim = self.running.pop()
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            if seq.seq_id not in kv.seqs:
                break
            kv.append(seq.seq_id, seq.tokens[seq.num_computed:seq.num_computed + n], seq.hashes)
            cost.add_tokens(prof, n, seq.num_computed)
            scheduled.append((seq, n))
            budget -= n
            i += 1
        while (self.waiting and not preempted and budget > 0
               and len(self.running) < cfg.max_num_seqs
               and self.waiting[0].req.stats.arrival <= self.sim_now):
            seq = self.waiting[0]
            n = self._admit(seq, budget, cost)
            if n is None:
                break
            self.waiting.popleft()
            self.running.append(seq)
            scheduled.append((seq, n))
            budget -= n
        return scheduled, cost

    def _admit(self, seq: Seq, budget: int, cost: StepCost) -> int | None:
        """Start a waiting sequence: prefix hit, then CPU-tier/swap loads, then prefill."""
        kv, bs = self.kv, self.config.block_size
        total = len(seq.tokens)
        matched = kv.match(seq.hashes, total)
        cached = len(matched) * bs
        loaded_to = cached
        if seq.swapped_tokens:
            loaded_to = max(cached, min(seq.swapped_tokens, total - 1))
        elif self.cpu_tier.capacity_blocks:
            limit = (total - 1) // bs
            extra = self.cpu_tier.match(seq.hashes[len(matched):limit])
            loaded_to = cached + extra * bs
        n = min(total - loaded_to, budget)
        reserve = self._reservation(len(seq.req.prompt), seq.req.max_tokens)
        if not kv.can_start(matched, loaded_to + n, reserve):
            return None
        kv.start(seq.seq_id, matched, seq.tokens, reserve)
        kv.append(seq.seq_id, seq.tokens[cached:loaded_to], seq.hashes)
        if loaded_to > cached and seq.swapped_tokens:
            cost.add_swap(self.profile, loaded_to - cached, bs)
        elif loaded_to > cached:
            cost.add_transfer(self.profile, loaded_to - cached)
        kv.append(seq.seq_id, seq.tokens[loaded_to:loaded_to + n], seq.hashes)
        cost.add_tokens(self.profile, n, loaded_to)
        seq.num_computed = loaded_to
        seq.swapped_tokens = 0
        if not seq.admitted:
            seq.admitted = True
            stats, m = seq.req.stats, self.metrics
            stats.gpu_cached_tokens = cached
            stats.cached_tokens = loaded_to
            self.counters.prefix_queries += total
            self.counters.prefix_hits += cached
            self.counters.external_hits += loaded_to - cached
            self.counters.prompt_tokens += total
            m.m(m.prefix_queries).inc(total)
            m.m(m.prefix_hits).inc(cached)
            if self.cpu_tier.capacity_blocks:
                m.m(m.external_queries).inc(total - cached)
                m.m(m.external_hits).inc(loaded_to - cached)
            m.m(m.prompt_tokens).inc(total)
        return n

    def _preempt(self, seq: Seq) -> None:
        kv = self.kv
        seq.hashes = kv.seqs[seq.seq_id].hashes
        kv.free(seq.seq_id)
        self.counters.preempted_tokens += seq.num_computed
        if self.config.preemption_mode == "swap":
            seq.swapped_tokens = seq.num_computed
            self._pending_swap_out.append(seq.num_computed)
        seq.num_computed = 0
        seq.preempted_at = self.sim_now
        self.waiting.appendleft(seq)
        seq.req.stats.preemptions += 1
        self.counters.preemptions += 1
        self.metrics.m(self.metrics.preemptions).inc()

    def _finish_step(self, scheduled: list[tuple[Seq, int]]) -> None:
        for seq, n in scheduled:
            if seq.finished or seq.seq_id not in self.kv.seqs:
                continue
            seq.num_computed += n
            if seq.num_computed < len(seq.tokens):
                continue
            if seq.req.n > 1 and not seq.req.forked:
                self._fork(seq)
                for child in [s for s in self.running if s.req is seq.req and s is not seq]:
                    self._sample(child)
            self._sample(seq)

    def _fork(self, parent: Seq) -> None:
        req = parent.req
        req.forked = True
        for index in range(1, req.n):
            child = Seq(req=req, index=index, tokens=list(parent.tokens),
                        hashes=list(self.kv.seqs[parent.seq_id].hashes),
                        num_computed=parent.num_computed, admitted=True)
            self.kv.fork(parent.seq_id, child.seq_id)
            self.running.append(child)
            req.live_seqs += 1

    def _sample(self, seq: Seq) -> None:
        req, cfg = seq.req, self.config
        tok = textgen.next_token(cfg.seed, req.key, seq.index, seq.outputs,
                                 self.profile.model.vocab)
        seq.tokens.append(tok)
        seq.outputs += 1
        if seq.preempted_at is not None:
            req.stats.resume_s.append(self.sim_now - seq.preempted_at)
            seq.preempted_at = None
        req.stats.completion_tokens += 1
        self.counters.generation_tokens += 1
        self.metrics.m(self.metrics.generation_tokens).inc()
        if req.stats.first_token is None:
            req.stats.first_token = self.sim_now
            self.metrics.m(self.metrics.ttft).observe(req.stats.ttft or 0.0)
        done = seq.outputs >= req.max_tokens or len(seq.tokens) >= self.max_model_len
        req.queue.put_nowait(TokenEvent(seq.index, tok, textgen.token_text(tok),
                                        "length" if done else None))
        if done:
            self._retire(seq)

    def _retire(self, seq: Seq) -> None:
        seq.finished = True
        if seq.seq_id in self.kv.seqs:
            self.kv.free(seq.seq_id)
        if seq in self.running:
            self.running.remove(seq)
        req = seq.req
        req.live_seqs -= 1
        if req.live_seqs == 0 and not req.done:
            req.done = True
            req.stats.finished = self.sim_now
            if not req.aborted:
                self.counters.finished += 1
                self.metrics.m(self.metrics.e2e).observe(req.stats.e2e or 0.0)
                self.metrics.request_success.labels(model_name=self.config.model_name,
                                                    finished_reason="length").inc()
            req.queue.put_nowait(None)

    def _abort(self, req: Request) -> None:
        if req.done:
            return
        req.aborted = True
        for seq in [s for s in (*self.running, *self.waiting) if s.req is req]:
            if seq in self.waiting:
                self.waiting.remove(seq)
                seq.finished = True
                req.live_seqs -= 1
                if req.live_seqs == 0:
                    req.done = True
                    req.queue.put_nowait(None)
            else:
                self._retire(seq)
        self._update_gauges()

    def _update_gauges(self) -> None:
        m = self.metrics
        m.m(m.kv_usage).set(self.kv.usage())
        m.m(m.running).set(self.num_running_requests)
        m.m(m.waiting).set(self.num_waiting_requests)
