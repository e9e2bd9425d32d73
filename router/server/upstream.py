"""How the router reaches its workers: the TLS trust for https:// workers, and the keys it
presents to them (router/fleet/upstream_keys.py).

One ``ssl.SSLContext`` sits on the one client session (server/contexts.py), so requests,
health probes, model listings, metrics scrapes and LoRA loads all verify a worker's
certificate the same way: against ``--upstream-ca-file`` when given (that bundle alone,
as ``curl --cacert`` does), else the system trust store; hostnames are always checked.
Both are read at start, so a missing file fails the start with one line naming it.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field

from router.config import ConfigError, RouterConfig
from router.fleet.upstream_keys import KeyFileError, UpstreamKeys


@dataclass(frozen=True)
class UpstreamAccess:
    ssl: ssl.SSLContext | None  # None: aiohttp's default (the system trust store)
    keys: UpstreamKeys = field(default_factory=UpstreamKeys)


def trust(config: RouterConfig) -> ssl.SSLContext | None:
    if not config.upstream_ca_file:
        return None
    try:
        return ssl.create_default_context(cafile=config.upstream_ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"invalid config: upstream_ca_file: cannot load "
                          f"{config.upstream_ca_file}: {exc}") from None


def load_upstream(config: RouterConfig) -> UpstreamAccess:
    try:
        keys = UpstreamKeys.load(config.upstream_api_keys_file, config.upstream_api_key)
    except KeyFileError as exc:
        raise ConfigError(f"invalid config: upstream_api_keys_file: {exc}") from None
    return UpstreamAccess(trust(config), keys)
