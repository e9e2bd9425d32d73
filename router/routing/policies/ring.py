"""Consistent-hash rings over worker ids (uhashring), cached per membership."""

from __future__ import annotations

from array import array
from bisect import bisect
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from itertools import chain, islice

from uhashring import HashRing

from router.fleet.workers import Worker

TAG_BITS = 16  # a ring entry: a point's top 48 bits, then its node's number
_TAG = (1 << TAG_BITS) - 1


class _Ring:
    """One membership's ring as one flat array, and the walks of recent keys.

    uhashring keeps its 160 points a node as 128-bit ints in a list and their owners in a
    dict: at 1,000 workers a walk of five nodes touched ~40 scattered objects and cost
    ~20 µs in a router's loop, against 4 µs in a tight one. Here each entry is a point's
    top 48 bits and its node's number in one uint64 (1.3 MB at 1,000 workers), sorted:
    uhashring's order. A key's first ``HEAD`` nodes are kept too: a context's requests,
    and the shortlist and the policy within one decision, walk the same key."""

    HEAD = 8
    MEMO = 8192  # keys whose walk is kept (~300 bytes each: ~2.4 MB a ring, 8 rings kept)

    __slots__ = ("_count", "_entries", "_hash", "_memo", "_names")

    def __init__(self, entries: array, names: list[str], count: int,
                 hash_key: Callable[[str], int]) -> None:
        self._entries = entries
        self._names = names  # node number -> id (the cache's; a number is reused only
        # once no kept ring holds its node)
        self._count = count
        self._hash = hash_key
        self._memo: dict[str, tuple[str, ...]] = {}

    def walk(self, key: str) -> Iterator[str]:
        head = self._memo.get(key)
        if head is None:
            head = tuple(islice(self._walk(key), self.HEAD))
            memo = self._memo
            if len(memo) >= self.MEMO:
                del memo[next(iter(memo))]  # the oldest kept
            memo[key] = head
        yield from head
        if len(head) == self.HEAD:
            yield from islice(self._walk(key), self.HEAD, None)

    def _walk(self, key: str) -> Iterator[str]:
        """Ids clockwise from the key's point, each once (uhashring's ``iterate_nodes``
        order, walked lazily: it slices its whole point list before the first node)."""
        entries, names = self._entries, self._names
        n = len(entries)
        start = bisect(entries, (self._hash(key) >> 80) << TAG_BITS | _TAG)
        seen: set[int] = set()
        for i in range(start, start + n):
            node = entries[i - n if i >= n else i] & _TAG
            if node not in seen:
                seen.add(node)
                yield names[node]
                if len(seen) == self._count:
                    return


class RingCache:
    """Rings per membership, a few kept: membership rarely changes, but a breaker that
    opens changes a small fleet's candidates, and a worker joining a large one changes
    its fleet.

    Each node's points come from uhashring once (a ring of that node alone) and are kept,
    tagged with the node's number, while some kept ring holds the node: a new
    membership's ring is its nodes' entries sorted together in C, not 160 md5s a node
    again. A whole uhashring build stalled the event loop for ~9 ms at 8 workers, ~80 ms
    at 64 and ~1.4 s at 1,000, on every change."""

    def __init__(self, size: int = 8) -> None:
        self._rings: OrderedDict[frozenset[str], _Ring] = OrderedDict()
        self._size = size
        self._entries: dict[str, list[int]] = {}  # node id -> its tagged points (each
        # entry's low TAG_BITS are the node's number)
        self._names: list[str] = []  # node number -> id
        self._free: list[int] = []  # numbers of nodes no kept ring holds
        self._hash = HashRing().hashi  # uhashring's key hash (md5)

    def _node_entries(self, worker_id: str) -> list[int]:
        entries = self._entries.get(worker_id)
        if entries is None:
            if self._free:
                number = self._free.pop()
                self._names[number] = worker_id
            else:
                number = len(self._names)
                if number > _TAG:
                    raise ValueError(f"a ring holds at most {_TAG + 1} workers")
                self._names.append(worker_id)
            points = HashRing(nodes=[worker_id]).runtime._keys
            entries = self._entries[worker_id] = [p >> 80 << TAG_BITS | number
                                                  for p in points]
        return entries

    def _ring(self, ids: frozenset[str]) -> _Ring:
        ring = self._rings.get(ids)
        if ring is None:
            merged = sorted(chain.from_iterable(map(self._node_entries, ids)))
            ring = self._rings[ids] = _Ring(array("Q", merged), self._names, len(ids),
                                            self._hash)
            if len(self._rings) > self._size:
                self._rings.popitem(last=False)
                self._forget_unheld()
        else:
            self._rings.move_to_end(ids)
        return ring

    def _forget_unheld(self) -> None:
        held = frozenset().union(*self._rings)
        for worker_id in [w for w in self._entries if w not in held]:
            self._free.append(self._entries.pop(worker_id)[0] & _TAG)

    def walk(self, key: str, candidates: Sequence[Worker]) -> Iterator[Worker]:
        """Candidates clockwise from the key's point: the ring owner first."""
        by_id = {w.id: w for w in candidates}
        for worker_id in self.walk_ids(key, frozenset(by_id)):
            yield by_id[worker_id]

    def walk_ids(self, key: str, ids: frozenset[str]) -> Iterator[str]:
        """Ids clockwise from the key's point. ``ids`` is also the ring's cache key: a
        fleet view passes the same frozenset every time, so finding its ring costs a
        dict probe, not a hash of 1,000 ids."""
        if len(ids) == 1:
            return iter(ids)
        return self._ring(ids).walk(key)
