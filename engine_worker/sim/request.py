"""Requests as the engine sees them, and the handle a caller iterates for tokens."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

_ids = itertools.count()


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One generated token of one choice; the last one carries ``finish_reason``."""

    index: int
    token_id: int
    text: str
    finish_reason: str | None = None


@dataclass
class RequestStats:
    """What the engine measured for a request, in simulated seconds."""

    prompt_tokens: int = 0
    cached_tokens: int = 0      # GPU prefix hit + CPU-tier hit, as usage.cached_tokens
    gpu_cached_tokens: int = 0  # what vllm:prefix_cache_hits counts
    completion_tokens: int = 0
    arrival: float = 0.0
    first_token: float | None = None
    finished: float | None = None
    preemptions: int = 0
    resume_s: list[float] = field(default_factory=list)  # each preemption -> next token

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def e2e(self) -> float | None:
        return None if self.finished is None else self.finished - self.arrival


@dataclass(eq=False)
class Request:
    request_id: str
    prompt: list[int]
    prompt_hashes: list[bytes]
    max_tokens: int
    n: int
    key: bytes
    stats: RequestStats
    queue: asyncio.Queue[TokenEvent | None] = field(default_factory=asyncio.Queue)
    live_seqs: int = 0
    forked: bool = False
    aborted: bool = False
    done: bool = False


@dataclass(eq=False)
class Seq:
    """One choice of a request: its own token list and progress."""

    req: Request
    index: int
    tokens: list[int]
    hashes: list[bytes]          # known chain hashes of leading full blocks
    num_computed: int = 0
    outputs: int = 0
    swapped_tokens: int = 0      # swap preemption: tokens whose KV sits in host memory
    preempted_at: float | None = None
    admitted: bool = False
    finished: bool = False
    seq_id: int = field(default_factory=lambda: next(_ids))


class RequestHandle:
    """Async iterator of a request's TokenEvents; ``stats`` is final once it ends."""

    def __init__(self, req: Request, abort: Callable[[Request], None]) -> None:
        self._req = req
        self._abort = abort

    @property
    def request_id(self) -> str:
        return self._req.request_id

    @property
    def stats(self) -> RequestStats:
        return self._req.stats

    @property
    def done(self) -> bool:
        """Every choice has ended (offline drivers poll this between steps)."""
        return self._req.done

    def abort(self) -> None:
        """Stop generating (client went away) and free the request's blocks."""
        self._abort(self._req)

    def __aiter__(self) -> AsyncIterator[TokenEvent]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[TokenEvent]:
        while True:
            event = await self._req.queue.get()
            if event is None:
                return
            yield event

    async def collect(self) -> list[TokenEvent]:
        return [event async for event in self]
