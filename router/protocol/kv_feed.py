"""The KV-event feed a worker publishes (advertised in its registry record, or by vLLM at
``GET /kv_event_sources``), as the router subscribes to it: hashes only compare between
equal block sizes and seeds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

WILDCARD_HOSTS = frozenset({"", "*", "0.0.0.0", "::", "[::]"})


@dataclass(frozen=True, slots=True)
class FeedParams:
    endpoint: str
    replay_endpoint: str | None
    topic: str
    block_size: int
    hash_seed: str


class SourcesError(ValueError):
    """A /kv_event_sources answer the router cannot subscribe from."""


def _dialable(endpoint: str, worker_url: str) -> str:
    """A bind address (``tcp://0.0.0.0:P``, ``tcp://*:P``) as a subscriber dials it: the
    host the worker's HTTP API is reached at."""
    if not endpoint.startswith("tcp://"):
        return endpoint
    host, _, port = endpoint[len("tcp://"):].rpartition(":")
    if host in WILDCARD_HOSTS:
        host = urlsplit(worker_url).hostname or "127.0.0.1"
        host = f"[{host}]" if ":" in host else host
    return f"tcp://{host}:{port}"


def feed_from_sources(body: Any, worker_url: str, block_size: int,
                      hash_seed: str) -> FeedParams | None:
    """vLLM's KV-event discovery answer -> the feed to subscribe to; None when the worker
    publishes none. vLLM lists one source per data-parallel rank, as a bare JSON array of
    ``{data_parallel_rank, endpoint, replay_endpoint, topic}`` (some releases wrap it as
    ``{"sources": [...]}``). Several ranks are refused: each has its own cache behind the
    one HTTP address, so no single picture would be the worker's."""
    sources = body.get("sources") if isinstance(body, dict) else body
    if not isinstance(sources, list) or not all(isinstance(s, dict) for s in sources):
        raise SourcesError("expected a JSON array of sources")
    if not sources:
        return None
    if len(sources) > 1:
        raise SourcesError(f"{len(sources)} data-parallel ranks: precise mode follows "
                           "workers of one rank")
    source = sources[0]
    endpoint = source.get("endpoint")
    if not isinstance(endpoint, str) or not endpoint:
        raise SourcesError("a source without an endpoint")
    replay = source.get("replay_endpoint")
    return FeedParams(_dialable(endpoint, worker_url),
                      _dialable(replay, worker_url) if isinstance(replay, str) and replay
                      else None,
                      str(source.get("topic") or ""), block_size, hash_seed)
