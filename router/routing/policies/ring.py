"""Consistent-hash rings over worker ids (uhashring), cached per membership."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence

from uhashring import HashRing

from router.fleet.workers import Worker


class RingCache:
    """Building a ring costs milliseconds; membership rarely changes, so keep a few."""

    def __init__(self, size: int = 8) -> None:
        self._rings: OrderedDict[frozenset[str], HashRing] = OrderedDict()
        self._size = size

    def ring(self, ids: frozenset[str]) -> HashRing:
        ring = self._rings.get(ids)
        if ring is None:
            ring = HashRing(nodes=sorted(ids))
            self._rings[ids] = ring
            if len(self._rings) > self._size:
                self._rings.popitem(last=False)
        else:
            self._rings.move_to_end(ids)
        return ring

    def walk(self, key: str, candidates: Sequence[Worker]) -> Iterator[Worker]:
        """Candidates clockwise from the key's point: the ring owner first."""
        by_id = {w.id: w for w in candidates}
        if len(by_id) == 1:
            yield from by_id.values()
            return
        for node in self.ring(frozenset(by_id)).iterate_nodes(key, distinct=True):
            yield by_id[node]
