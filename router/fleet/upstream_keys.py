"""The API keys the router presents to workers (vLLM's ``--api-key``), and which is whose.

Why a file rather than a flag: a flag shows in ``ps`` and in the pod spec; a file can be a
mounted Secret. Why a registry worker names its key by fingerprint (``api_key_sha256`` in
its record) rather than carrying it: Redis is read by more than the routers (replicas,
backups, monitoring), and a router has to hold the keys anyway.

File format, one entry a line (blank lines and ``#`` comments skipped)::

    WORKER KEY    the key of the worker with that id or URL
    * KEY         the key of every worker without an entry of its own
    KEY           a key registry workers name by its fingerprint

A worker's key is, in this order: the one whose fingerprint its registry record names,
the one for its id, for its URL, the default (``*`` or ``--upstream-api-key``), none. With
a key the router sends ``Authorization: Bearer KEY`` to that worker in place of the
client's header; without one the client's header is forwarded as it came.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from router.protocol.registry import key_fingerprint

log = logging.getLogger(__name__)


class KeyFileError(ValueError):
    """An unreadable or malformed key file; the message never holds a key."""


@dataclass(frozen=True)
class UpstreamKeys:
    by_worker: dict[str, str] = field(default_factory=dict, repr=False)  # id or URL -> key
    by_fingerprint: dict[str, str] = field(default_factory=dict, repr=False)
    default: str | None = field(default=None, repr=False)

    @classmethod
    def build(cls, lines: Iterable[str], default: str | None = None) -> UpstreamKeys:
        by_worker: dict[str, str] = {}
        keys: list[str] = [default] if default else []
        for number, raw in enumerate(lines, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split()
            if len(parts) > 2:
                raise KeyFileError(f"line {number}: expected 'KEY' or 'WORKER KEY'")
            if len(parts) == 2:
                name, key = parts
                if name == "*":
                    if default is not None and default != key:
                        raise KeyFileError(f"line {number}: a second default key")
                    default = key
                else:
                    if name in by_worker:
                        raise KeyFileError(f"line {number}: a second key for {name}")
                    by_worker[name.rstrip("/")] = key
            else:
                key = parts[0]
            keys.append(key)
        return cls(by_worker, {key_fingerprint(k): k for k in keys}, default)

    @classmethod
    def load(cls, path: str, default: str | None = None) -> UpstreamKeys:
        """The keys of ``path`` (empty path: only ``default``)."""
        if not path:
            return cls.build((), default or None)
        try:
            with open(path, encoding="utf-8") as fh:
                lines = fh.read().splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise KeyFileError(f"cannot read {path}: {exc.__class__.__name__}") from None
        try:
            return cls.build(lines, default or None)
        except KeyFileError as exc:
            raise KeyFileError(f"{path}: {exc}") from None

    def __bool__(self) -> bool:
        return bool(self.by_worker or self.by_fingerprint or self.default)

    def for_worker(self, worker_id: str, url: str, fingerprint: str = "") -> str | None:
        """The key to present to this worker, or None to forward the client's header."""
        if fingerprint:
            key = self.by_fingerprint.get(fingerprint)
            if key is not None:
                return key
            log.warning("worker %s demands an API key (fingerprint %s) the router does not "
                        "hold", worker_id, fingerprint)
        return self.by_worker.get(worker_id) or self.by_worker.get(url.rstrip("/")) \
            or self.default
