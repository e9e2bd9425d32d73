"""The router's one Redis client: built from ``redis_url``, shared by residency, discovery, load.

Three deployments, one URL each:
- one server: ``redis://[:password@]host:port/db``, ``rediss://`` (TLS) or ``unix://``;
- Redis Cluster: ``redis+cluster://[:password@]host:port[,host:port...]`` (any of the nodes;
  the client learns the slot map and follows MOVED/ASK), ``rediss+cluster://`` for TLS;
- Sentinel: ``redis+sentinel://[:password@]host:port[,host:port...]/SERVICE[/db]``
  (``rediss+sentinel://`` for TLS to the master). The client asks the sentinels for
  SERVICE's master and asks again whenever a connection fails, so a failover costs the
  calls in flight at that moment and nothing after.

Every multi-key command and Lua call of the router touches one hash slot (the key schema
in router/protocol/registry.py and residency/redis.py tags its keys), so the same code
runs on all three.

Retries are off inside redis-py on purpose: the callers decide what a failure means (the
residency store backs off and falls back to its local view; the background loops simply
try again on their next tick), so a dead Redis costs one fast failure, never a stack of
client-side retries on the request path.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff

from router.infra.metrics import RouterMetrics

T = TypeVar("T")
RedisClient = Redis | RedisCluster
_TIMEOUTS: dict[str, Any] = {"socket_connect_timeout": 1.0, "socket_timeout": 2.0}


def make_client(url: str, socket_timeout: float = 2.0) -> RedisClient:
    """A client for any of the URLs above (``REDIS_SCHEMES`` in router/config.py); lazy."""
    scheme = url.split("://", 1)[0]
    options = {**_TIMEOUTS, "socket_timeout": socket_timeout}
    if scheme.endswith("+cluster"):
        return _cluster(url, options)
    if scheme.endswith("+sentinel"):
        return _sentinel(url, options)
    return Redis.from_url(url, retry=Retry(NoBackoff(), 0), health_check_interval=0, **options)


def is_cluster(client: object) -> bool:
    return isinstance(client, RedisCluster)


def _hosts(netloc: str) -> tuple[dict[str, Any], list[tuple[str, int]]]:
    """'[user:password@]h1:p1,h2:p2' -> (auth options, [(h1, p1), (h2, p2)])."""
    auth, _, hosts = netloc.rpartition("@")
    options: dict[str, Any] = {}
    if auth:
        user, _, password = auth.partition(":")
        if user:
            options["username"] = unquote(user)
        if password:
            options["password"] = unquote(password)
    out = []
    for item in hosts.split(","):
        host, _, port = item.strip().rpartition(":")
        if not host:
            raise ValueError(f"redis URL host {item!r} needs host:port")
        out.append((host.strip("[]"), int(port)))
    return options, out


def _cluster(url: str, options: dict[str, Any]) -> RedisCluster:
    parts = urlsplit(url)
    auth, hosts = _hosts(parts.netloc)
    return RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in hosts],
                        ssl=parts.scheme.startswith("rediss"), retry=Retry(NoBackoff(), 0),
                        **auth, **options)


def _sentinel(url: str, options: dict[str, Any]) -> Redis:
    parts = urlsplit(url)
    auth, hosts = _hosts(parts.netloc)
    path = [p for p in parts.path.split("/") if p]
    if not path:
        raise ValueError("redis+sentinel URL needs the service name: .../SERVICE[/db]")
    db = int(path[1]) if len(path) > 1 else 0
    # the sentinels themselves are asked with the same timeouts and no password: sentinels
    # are usually unauthenticated while the data nodes are not (their own ``requirepass``)
    sentinel = Sentinel(hosts, sentinel_kwargs=dict(options), **options)
    return sentinel.master_for(path[0], db=db, ssl=parts.scheme.startswith("rediss"),
                               retry=Retry(NoBackoff(), 0), health_check_interval=0,
                               **auth)


async def timed(metrics: RouterMetrics, op: str, call: Awaitable[T]) -> T:
    """Await a Redis call, observing its latency or counting its failure under ``op``."""
    started = time.perf_counter()
    try:
        result = await call
    except BaseException:
        metrics.redis_errors.labels(op).inc()
        raise
    metrics.child(metrics.redis_latency, op).observe(time.perf_counter() - started)
    return result
