"""The in-memory residency on disk, so a router restarted without Redis does not route cold.

The engines keep their caches while the router restarts; without this file the new router
knows none of it and scatters every context until it relearns them. The picture is saved
on shutdown and every ``interval`` (a supervised task, off the request path) and loaded at
start when younger than a TTL: an old picture describes caches the engines have long since
turned over, and a stale "warm" is worse than a cold start. What the file cannot know
(a worker restarted meanwhile) the closed loop on the engines' cached tokens corrects.

Format: a magic line, a length-prefixed JSON header (creation time; per worker its id,
capacity and the counts below), then per worker its blocks oldest first as fixed-width
bytes, their stamps as little-endian int64, their weights (``ChainShape``) as bytes, and
the chain heads it holds. Binary because a fleet's picture runs to millions of 8-byte
blocks; the copy is taken on the event loop (C-speed), the encoding and the write run in a
thread, and the write is atomic (a temporary file renamed over the old one), so a crash
mid-save leaves the previous file.
"""

from __future__ import annotations

import asyncio
import logging
import os
import struct
import sys
import tempfile
import time
from array import array
from pathlib import Path

import orjson

from router.residency.memory import MemoryResidency, WorkerBlocks

log = logging.getLogger(__name__)

MAGIC = b"prefix-router residency v3\n"  # v3: each block's weight
MAGIC_V2 = b"prefix-router residency v2\n"  # sha256 links as v3, no weights: each weighs one
# (v1's blake2b links name nothing this router hashes: such a file is refused, not
# restored as dead weight)
_LENGTH = struct.Struct("<I")


class SnapshotError(ValueError):
    """The file is not a residency snapshot this version can read."""


def _stamps(values: list[int]) -> bytes:
    packed = array("q", values)
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tobytes()


def _unstamps(data: bytes) -> list[int]:
    packed = array("q")
    packed.frombytes(data)
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tolist()


def encode(workers: dict[str, WorkerBlocks], created: float) -> bytes:
    entries: list[dict[str, object]] = []
    body: list[bytes] = []
    for worker_id, saved in workers.items():
        blocks = [b for b, _, _ in saved.blocks]
        width = len(blocks[0]) if blocks else 8
        if any(len(b) != width for b in blocks) or any(len(h) != width for h in saved.heads):
            log.warning("residency snapshot: %s has blocks of mixed widths; skipped", worker_id)
            continue
        entries.append({"id": worker_id, "capacity": saved.capacity, "width": width,
                        "blocks": len(blocks), "heads": len(saved.heads)})
        body += [b"".join(blocks), _stamps([s for _, s, _ in saved.blocks]),
                 bytes(n for _, _, n in saved.blocks), b"".join(saved.heads)]
    head = orjson.dumps({"created": created, "workers": entries})
    return b"".join([MAGIC, _LENGTH.pack(len(head)), head, *body])


class _Reader:
    def __init__(self, data: bytes, pos: int) -> None:
        self._data = data
        self._pos = pos

    def take(self, n: int) -> bytes:
        if n < 0 or self._pos + n > len(self._data):
            raise SnapshotError("residency snapshot is truncated")
        out = self._data[self._pos:self._pos + n]
        self._pos += n
        return out


def decode(data: bytes) -> tuple[float, dict[str, WorkerBlocks]]:
    """(creation time, workers) of a snapshot; SnapshotError if it is not one."""
    weighed = data.startswith(MAGIC)
    if not weighed and not data.startswith(MAGIC_V2):
        raise SnapshotError("not a residency snapshot")
    reader = _Reader(data, len(MAGIC))  # both magics are as long
    try:
        (length,) = _LENGTH.unpack(reader.take(_LENGTH.size))
        header = orjson.loads(reader.take(length))
        workers: dict[str, WorkerBlocks] = {}
        for entry in header["workers"]:
            width, n, h = int(entry["width"]), int(entry["blocks"]), int(entry["heads"])
            if width <= 0:
                raise SnapshotError("residency snapshot has a zero block width")
            raw, stamps = reader.take(width * n), reader.take(8 * n)
            weights = reader.take(n) if weighed else bytes([1]) * n
            heads = reader.take(width * h)
            capacity = entry.get("capacity")
            workers[str(entry["id"])] = WorkerBlocks(
                list(zip(_split(raw, width), _unstamps(stamps), weights, strict=True)),
                _split(heads, width), None if capacity is None else int(capacity))
        return float(header["created"]), workers
    except SnapshotError:
        raise
    except (struct.error, orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise SnapshotError(f"unreadable residency snapshot: {exc!r}") from None


def _split(data: bytes, width: int) -> list[bytes]:
    return [data[i:i + width] for i in range(0, len(data), width)]


class ResidencySnapshot:
    """Saves and loads one MemoryResidency to and from ``path``."""

    def __init__(self, residency: MemoryResidency, path: str, ttl_s: float) -> None:
        self._residency = residency
        self._path = Path(path)
        self._ttl_s = ttl_s

    def load(self) -> int:
        """Restore the picture if the file exists, is readable and younger than the TTL;
        the number of workers restored (0 when nothing was)."""
        try:
            data = self._path.read_bytes()
        except FileNotFoundError:
            return 0
        except OSError as exc:
            log.warning("residency snapshot %s unreadable: %s", self._path, exc)
            return 0
        try:
            created, workers = decode(data)
        except SnapshotError as exc:
            log.warning("residency snapshot %s ignored: %s", self._path, exc)
            return 0
        age = time.time() - created
        if not 0 <= age <= self._ttl_s:
            log.info("residency snapshot %s is %.0fs old (ttl %.0fs): starting cold",
                     self._path, age, self._ttl_s)
            return 0
        self._residency.restore(workers)
        log.info("residency restored from %s (%.0fs old, %d workers)", self._path, age,
                 len(workers))
        return len(workers)

    async def save(self) -> None:
        workers = self._residency.export()  # on the loop: the dicts are not thread-safe
        await asyncio.to_thread(self._write, workers, time.time())
        log.debug("residency saved to %s (%d workers)", self._path, len(workers))

    def _write(self, workers: dict[str, WorkerBlocks], created: float) -> None:
        data = encode(workers, created)
        self._path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self._path.parent, prefix=self._path.name + ".")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self._path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    async def run(self, interval_s: float) -> None:
        """Save every ``interval_s`` until cancelled (under the app's supervisor)."""
        while True:
            await asyncio.sleep(interval_s)
            await self.save()
