"""Hot-prefix replicas: where each context has been placed, and which placements are live.

A context starts with one home, its ring owner. When every live replica is predicted too
slow the policy places a *hot* context's request elsewhere (``hot_uses`` requests within
``idle_s``) and that worker becomes another replica; a replica that takes none of the
context's requests for ``idle_s`` stops counting. A context that is not hot keeps its warm
home: moving it would recompute its prefix and leave the warm copy unused (a conversation
whose next turn is half a minute away gains nothing from a second copy). So
replication grows with a context's load and shrinks when the load goes, and the number
of replicas per context is a metric, not an accident of spills.

A context also has a *demand*, its share of the fleet's recent requests (decayed over
``idle_s``), and a *trunk*, the chain its recent requests all share. One carrying more
than k workers' fair share wants k replicas (``wanted``), and a request that adds a new
branch to its trunk may found one: an agent persona's tool prompt keys every step of
every session started from it, and placed on queue pressure alone its sessions piled onto
the 2-3 workers that first held it while others took none (offline agentic replay: 0
requests on 2 of 8 workers). Its *branches* (``branched``) tell whether a new branch
brings later requests (an agent session's steps) or is one (a document's question), and
each worker's recent placements against the fleet's (``recent``, ``fleet_recent``) where
a new branch balances the fleet.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from router.routing.keys import shared_links


@dataclass(slots=True)
class _Context:
    replicas: dict[str, float] = field(default_factory=dict)  # worker id -> last use
    uses: list[float] = field(default_factory=list)  # its last ``hot_uses`` uses
    demand: float = 0.0  # uses, each decayed over idle_s, as of ``at``
    at: float = 0.0
    trunk: tuple[bytes, ...] = ()  # a recent request's chain; its first ``depth`` links
    depth: int = 0  # are shared by every request of the context seen since
    branches: float = 0.0  # new branches of the trunk, each decayed over idle_s, as of
    branched_at: float = 0.0


class ReplicaSets:
    def __init__(self, idle_s: float = 30.0, hot_uses: int = 3, max_contexts: int = 200_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.idle_s = idle_s
        self.hot_uses = hot_uses
        self._max = max_contexts
        self._clock = clock
        self._contexts: OrderedDict[str, _Context] = OrderedDict()
        self._total, self._total_at = 0.0, 0.0  # every context's demand, alike
        self._placed: dict[str, tuple[float, float]] = {}  # worker id -> demand, at
        self._placed_total, self._placed_at = 0.0, 0.0
        self._work: dict[str, tuple[float, float]] = {}  # worker id -> prefill work, at
        self._work_total, self._work_at = 0.0, 0.0
        self._openers: OrderedDict[bytes, tuple[float, float]] = OrderedDict()  # link ->
        # new contexts that started from it, at; and all new contexts, at
        self._opened, self._opened_at = 0.0, 0.0

    def live(self, context: str) -> dict[str, float]:
        """Worker id -> last use, for replicas used within ``idle_s`` (stale ones dropped)."""
        record = self._contexts.get(context)
        if record is None:
            return {}
        replicas = record.replicas
        cutoff = self._clock() - self.idle_s
        for worker_id in [w for w, used in replicas.items() if used < cutoff]:
            del replicas[worker_id]
        if not replicas:
            del self._contexts[context]
        return replicas

    def use(self, context: str, worker_id: str, chain: tuple[bytes, ...] = (),
            work: float = 0.0) -> int:
        """Record a placement of a request with ``chain`` that adds ``work`` (prefill
        token-equivalents) to the worker; returns the replica count."""
        now = self._clock()
        record = self._contexts.get(context)
        if record is None:
            record = self._contexts[context] = _Context(trunk=chain, depth=len(chain))
            if len(self._contexts) > self._max:
                self._contexts.popitem(last=False)
        else:
            self._contexts.move_to_end(context)
            record.depth = shared_links(record.trunk, chain, record.depth)
            record.trunk = chain
        record.replicas[worker_id] = now
        record.uses.append(now)
        if len(record.uses) > self.hot_uses:
            del record.uses[0]
        record.demand = self._decayed(record.demand, record.at, now) + 1.0
        record.at = now
        self._total = self._decayed(self._total, self._total_at, now) + 1.0
        self._total_at = now
        placed, at = self._placed.get(worker_id, (0.0, now))
        self._placed[worker_id] = self._decayed(placed, at, now) + 1.0, now
        self._placed_total = self._decayed(self._placed_total, self._placed_at, now) + 1.0
        self._placed_at = now
        if work > 0:
            done, at = self._work.get(worker_id, (0.0, now))
            self._work[worker_id] = self._decayed(done, at, now) + work, now
            self._work_total = self._decayed(self._work_total, self._work_at, now) + work
            self._work_at = now
        return len(record.replicas)

    def opened(self, link: bytes | None) -> float:
        """Record a new context (no live replica) whose prompt matched warm up to ``link``
        (None: nothing held, or nothing worth keeping); returns the share of recent new
        contexts that started from ``link`` before this one, each decayed over
        ``idle_s``. A chat's system prompt starts them all, a retrieved document the few
        that ask about it."""
        now = self._clock()
        self._opened = self._decayed(self._opened, self._opened_at, now) + 1.0
        self._opened_at = now
        if link is None:
            return 0.0
        count, at = self._openers.pop(link, (0.0, now))
        count = self._decayed(count, at, now) + 1.0
        self._openers[link] = count, now  # the newest last
        if len(self._openers) > self._max:
            self._openers.popitem(last=False)
        return (count - 1.0) / self._opened

    def recent_work(self, worker_id: str) -> float:
        """Prefill work placed on the worker, decayed over ``idle_s``."""
        done, at = self._work.get(worker_id, (0.0, 0.0))
        return self._decayed(done, at, self._clock())

    def fleet_work(self) -> float:
        """Every worker's ``recent_work``, summed."""
        return self._decayed(self._work_total, self._work_at, self._clock())

    def recent(self, worker_id: str) -> float:
        """Requests placed on the worker, each decayed over ``idle_s``: where a new branch
        balances the fleet over the next half minute, which a queue seen at one instant
        does not tell (an agent fleet ~5 % busy is idle everywhere at most instants)."""
        placed, at = self._placed.get(worker_id, (0.0, 0.0))
        return self._decayed(placed, at, self._clock())

    def fleet_recent(self) -> float:
        """Every worker's ``recent``, summed."""
        return self._decayed(self._placed_total, self._placed_at, self._clock())

    def _decayed(self, count: float, at: float, now: float) -> float:
        """A count kept at ``at``, as of ``now``: each use fades over ``idle_s``."""
        return count * math.exp((at - now) / self.idle_s)

    def is_hot(self, context: str) -> bool:
        """At least ``hot_uses`` requests within ``idle_s``: a context worth a second copy.
        A conversation (a turn every half minute) is not; a popular document is."""
        record = self._contexts.get(context)
        return (record is not None and len(record.uses) >= self.hot_uses
                and self._clock() - record.uses[0] <= self.idle_s)

    def wanted(self, context: str, workers: int) -> int:
        """Replicas the context's recent requests fill at the fleet's mean load: k when it
        carries more than k - 1 of ``workers`` workers' fair share (rounded up: rounded
        down, three agent personas of 55, 27 and 18 % wanted 4 + 2 + 1 of 8 workers, and
        the eighth took nothing)."""
        record = self._contexts.get(context)
        if record is None or self._total <= 0:
            return 1
        share = self._decayed(record.demand, record.at, self._total_at) / self._total
        return max(1, math.ceil(workers * share))

    def branched(self, context: str) -> float:
        """Record a new branch of the context's trunk; returns its recent requests per
        recent branch, this one counted: what a branch placed now brings its worker later.
        An agent session's steps follow its first (~10 a branch); a hot document's
        questions are one request each, and moving one to balance buys nothing later."""
        record = self._contexts.get(context)
        if record is None:
            return 1.0
        now = self._clock()
        record.branches = self._decayed(record.branches, record.branched_at, now) + 1.0
        record.branched_at = now
        return self._decayed(record.demand, record.at, now) / record.branches

    def trunk_depth(self, context: str, chain: tuple[bytes, ...]) -> int | None:
        """How many links of ``chain`` lie on the context's trunk; None before its second
        request, when no trunk is known (a first request is all trunk)."""
        record = self._contexts.get(context)
        if record is None or len(record.uses) < 2:
            return None
        return shared_links(record.trunk, chain, record.depth)

    def forget_worker(self, worker_id: str) -> None:
        placed, at = self._placed.pop(worker_id, (0.0, 0.0))
        self._placed_total = max(0.0, self._placed_total
                                 - self._decayed(placed, at, self._placed_at))
        done, at = self._work.pop(worker_id, (0.0, 0.0))
        self._work_total = max(0.0, self._work_total - self._decayed(done, at, self._work_at))
        for context in [c for c, r in self._contexts.items()
                        if r.replicas.pop(worker_id, None) and not r.replicas]:
            del self._contexts[context]

    def __len__(self) -> int:
        return len(self._contexts)
