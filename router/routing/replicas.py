"""Hot-prefix replicas: where each context has been placed, and which placements are live.

A context starts with one home, its ring owner. When every live replica is predicted too
slow the policy places a *hot* context's request elsewhere (``hot_uses`` requests within
``idle_s``) and that worker becomes another replica; a replica that takes none of the
context's requests for ``idle_s`` stops counting. A context that is not hot keeps its warm
home: moving it would recompute its prefix and leave the warm copy unused (a conversation
whose next turn is half a minute away gains nothing from a second copy). So
replication grows with a context's load and shrinks when the load goes, and the number
of replicas per context is a metric, not an accident of spills.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable


class ReplicaSets:
    def __init__(self, idle_s: float = 30.0, hot_uses: int = 3, max_contexts: int = 200_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.idle_s = idle_s
        self.hot_uses = hot_uses
        self._max = max_contexts
        self._clock = clock
        self._sets: OrderedDict[str, dict[str, float]] = OrderedDict()
        self._uses: dict[str, list[float]] = {}  # context -> its last ``hot_uses`` uses

    def live(self, context: str) -> dict[str, float]:
        """Worker id -> last use, for replicas used within ``idle_s`` (stale ones dropped)."""
        replicas = self._sets.get(context)
        if not replicas:
            return {}
        cutoff = self._clock() - self.idle_s
        stale = [w for w, used in replicas.items() if used < cutoff]
        for worker_id in stale:
            del replicas[worker_id]
        if not replicas:
            del self._sets[context]
            self._uses.pop(context, None)
        return replicas

    def use(self, context: str, worker_id: str) -> int:
        """Record a placement; returns the context's replica count."""
        now = self._clock()
        replicas = self._sets.get(context)
        if replicas is None:
            replicas = self._sets[context] = {}
            if len(self._sets) > self._max:
                evicted, _ = self._sets.popitem(last=False)
                self._uses.pop(evicted, None)
        else:
            self._sets.move_to_end(context)
        replicas[worker_id] = now
        uses = self._uses.setdefault(context, [])
        uses.append(now)
        if len(uses) > self.hot_uses:
            del uses[0]
        return len(replicas)

    def is_hot(self, context: str) -> bool:
        """At least ``hot_uses`` requests within ``idle_s``: a context worth a second copy.
        A conversation (a turn every half minute) is not; a popular document is."""
        uses = self._uses.get(context)
        return (uses is not None and len(uses) >= self.hot_uses
                and self._clock() - uses[0] <= self.idle_s)

    def forget_worker(self, worker_id: str) -> None:
        for context in [c for c, r in self._sets.items() if r.pop(worker_id, None) and not r]:
            del self._sets[context]

    def __len__(self) -> int:
        return len(self._sets)
