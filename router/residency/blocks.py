"""A compact LRU of block hashes: about 35 bytes a block instead of an OrderedDict's 130-220.

An ``OrderedDict[bytes, int]`` spends a bytes object, an int object, a dict entry and a
linked-list node on every block: a 10 M-block picture took 1.2-1.5 GiB. Here a block is
a row of flat arrays, no Python object per block:

- ``_keys`` (int64: the 8-byte chain link read as a signed integer), ``_stamps``
  (int64: when it was last touched, the caller's clock) and ``_weights`` (uint8: the KV
  it stands for, in head blocks: a chain's tail links are longer) per entry, entries
  reused through a free list; ``units`` is the weights' sum, what capacity counts;
- ``_index``: an open-addressing table (linear probing, backward-shift deletion) of entry
  numbers, sized a power of two and kept under 70 % full, probed at the key's low bits
  (chain links are sha256 output, so the low bits are uniform);
- ``_log``: the touch order. Every touch appends the entry's number and records that
  position in ``_pos``; a log slot is live only while its entry's ``_pos`` still points
  at it, so the oldest live slot from ``_head`` is the least recently used block. The log
  is rewritten without its dead slots when they outnumber the live ones.

Touch order is exactly an ``OrderedDict``'s ``move_to_end`` order, so eviction and
``drop_older`` keep their meaning.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterator, Sequence
from hashlib import blake2b

_EMPTY = -1
_LOAD = 0.7


def block_key(block: bytes | int) -> int:
    """A chain link as the table's int64 key (links are 8 bytes; others are hashed to 8)."""
    if isinstance(block, int):
        return block
    if len(block) != 8:
        block = blake2b(block, digest_size=8).digest()
    return int.from_bytes(block, "little", signed=True)


def key_block(key: int) -> bytes:
    """The 8-byte link a key was read from (``block_key``'s inverse for 8-byte links)."""
    return key.to_bytes(8, "little", signed=True)


def chain_keys(chain: Sequence[bytes]) -> list[int]:
    """Every link of a chain as keys, in one unpack when all are 8 bytes."""
    try:
        return list(struct.unpack(f"<{len(chain)}q", b"".join(chain)))
    except struct.error:
        return [block_key(b) for b in chain]


class BlockLRU:
    __slots__ = ("_free", "_head", "_index", "_keys", "_live", "_log", "_mask", "_pos",
                 "_stamps", "_weights", "units")

    def __init__(self) -> None:
        self._keys = array("q")
        self._stamps = array("q")
        self._weights = array("B")
        self.units = 0
        self._pos = array("i")  # the entry's live slot in _log, or -1 when free
        self._free = array("i")
        self._log = array("i")
        self._head = 0
        self._live = 0
        self._index = array("i", [_EMPTY]) * 8
        self._mask = 7

    def __len__(self) -> int:
        return self._live

    def __bool__(self) -> bool:
        return self._live > 0

    def __contains__(self, block: bytes | int) -> bool:
        return self._find(block_key(block)) >= 0

    def __iter__(self) -> Iterator[int]:
        """Keys of the resident blocks, in no particular order."""
        keys, pos = self._keys, self._pos
        return iter([keys[e] for e in range(len(keys)) if pos[e] >= 0])

    def items(self) -> list[tuple[int, int, int]]:
        """(key, stamp, weight) of every resident block, least recently used first."""
        log, pos, keys, stamps, weights = self._log, self._pos, self._keys, self._stamps, \
            self._weights
        out = []
        for slot in range(self._head, len(log)):
            entry = log[slot]
            if pos[entry] == slot:
                out.append((keys[entry], stamps[entry], weights[entry]))
        return out

    def get(self, block: bytes | int, default: int | None = None) -> int | None:
        """The block's stamp."""
        entry = self._find(block_key(block))
        return default if entry < 0 else self._stamps[entry]

    def has_key(self, key: int) -> bool:
        return self._find(key) >= 0

    def _find(self, key: int) -> int:
        index, keys, mask = self._index, self._keys, self._mask
        i = key & mask
        while True:
            entry = index[i]
            if entry == _EMPTY or keys[entry] == key:
                return entry
            i = (i + 1) & mask

    def touch(self, key: int, stamp: int, weight: int = 1) -> None:
        """Insert or refresh ``key`` as the most recently used block, with its own stamp and
        weight (a snapshot's restore); a request's record is ``touch_chain``."""
        self.touch_chain((key,), stamp, 0, weight)

    def touch_chain(self, keys: Sequence[int], now: int, tail_from: int = 0,
                    tail_weight: int = 1) -> None:
        """Insert or refresh a chain's keys from its end, link i stamped ``now - i``: the
        head ends most recently used, so eviction drops tails before heads. A new link from
        index ``tail_from`` on weighs ``tail_weight`` (a link's index is fixed by its hash,
        so its weight never changes). One loop over hoisted locals: a call per block cost
        ~3 µs, and a request records up to ~500."""
        if self._live + len(keys) > _LOAD * (self._mask + 1):
            self._rehash(self._live + len(keys))  # no table growth inside the loop
        index, stored, stamps, pos, log = self._index, self._keys, self._stamps, self._pos, \
            self._log
        mask = self._mask
        for link in range(len(keys) - 1, -1, -1):
            key = keys[link]
            i = key & mask
            while True:
                entry = index[i]
                if entry == _EMPTY:
                    entry = index[i] = self._new_entry(
                        key, now - link, tail_weight if link >= tail_from else 1)
                    break
                if stored[entry] == key:
                    stamps[entry] = now - link
                    break
                i = (i + 1) & mask
            pos[entry] = len(log)
            log.append(entry)
        if len(log) > 2 * self._live + 1024:
            self._compact_log()

    def _new_entry(self, key: int, stamp: int, weight: int) -> int:
        self._live += 1
        self.units += weight
        if self._free:
            entry = self._free.pop()
            self._keys[entry] = key
            self._stamps[entry] = stamp
            self._weights[entry] = weight
            return entry
        self._keys.append(key)
        self._stamps.append(stamp)
        self._weights.append(weight)
        self._pos.append(-1)
        return len(self._keys) - 1

    def oldest_stamp(self) -> int | None:
        entry = self._oldest()
        return None if entry < 0 else self._stamps[entry]

    def _oldest(self) -> int:
        log, pos = self._log, self._pos
        head = self._head
        while head < len(log):
            entry = log[head]
            if pos[entry] == head:
                self._head = head
                return entry
            head += 1
        self._head = head
        return -1

    def pop_oldest(self) -> int:
        """Remove the least recently used block; its key."""
        entry = self._oldest()
        if entry < 0:
            raise KeyError("empty")
        key = self._keys[entry]
        self._remove(key)
        self._pos[entry] = -1
        self._free.append(entry)
        self._live -= 1
        self.units -= self._weights[entry]
        self._head += 1
        return key

    def _remove(self, key: int) -> None:
        """Backward-shift deletion: no tombstones, so probes stay short."""
        index, keys, mask = self._index, self._keys, self._mask
        i = key & mask
        while keys[index[i]] != key:
            i = (i + 1) & mask
        index[i] = _EMPTY
        j = i
        while True:
            j = (j + 1) & mask
            entry = index[j]
            if entry == _EMPTY:
                return
            home = keys[entry] & mask
            # move it back unless its home lies cyclically in (i, j]
            if (i <= j and (home <= i or home > j)) or (i > j and home <= i and home > j):
                index[i] = entry
                index[j] = _EMPTY
                i = j

    def _rehash(self, live: int) -> None:
        """A table for ``live`` entries at most half the load factor full."""
        size = (self._mask + 1) * 2
        while live > _LOAD * size / 2:
            size *= 2
        index = array("i", [_EMPTY]) * size
        mask = size - 1
        keys, pos = self._keys, self._pos
        for entry in range(len(keys)):
            if pos[entry] >= 0:
                i = keys[entry] & mask
                while index[i] != _EMPTY:
                    i = (i + 1) & mask
                index[i] = entry
        self._index, self._mask = index, mask

    def _compact_log(self) -> None:
        log, pos = self._log, self._pos
        fresh = array("i")
        for slot in range(self._head, len(log)):
            entry = log[slot]
            if pos[entry] == slot:
                pos[entry] = len(fresh)
                fresh.append(entry)
        self._log, self._head = fresh, 0
