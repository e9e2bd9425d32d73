"""Hot-prefix replicas: where each context has been placed, and which placements are live.

A context starts with one home, its ring owner. When every live replica is predicted too
slow the policy places the request elsewhere and that worker becomes another replica; a
replica that takes none of the context's requests for ``idle_s`` stops counting. So
replication grows with a context's load and shrinks when the load goes, and the number
of replicas per context is a metric, not an accident of spills.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable


class ReplicaSets:
    def __init__(self, idle_s: float = 30.0, max_contexts: int = 200_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.idle_s = idle_s
        self._max = max_contexts
        self._clock = clock
        self._sets: OrderedDict[str, dict[str, float]] = OrderedDict()

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
        return replicas

    def use(self, context: str, worker_id: str) -> int:
        """Record a placement; returns the context's replica count."""
        replicas = self._sets.get(context)
        if replicas is None:
            replicas = self._sets[context] = {}
            if len(self._sets) > self._max:
                self._sets.popitem(last=False)
        else:
            self._sets.move_to_end(context)
        replicas[worker_id] = self._clock()
        return len(replicas)

    def forget_worker(self, worker_id: str) -> None:
        for context in [c for c, r in self._sets.items() if r.pop(worker_id, None) and not r]:
            del self._sets[context]

    def __len__(self) -> int:
        return len(self._sets)
