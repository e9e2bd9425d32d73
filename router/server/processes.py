"""``--processes N``: N router processes accepting on one port (SO_REUSEPORT).

One asyncio process tops out at one core; the kernel spreads new connections over every
socket bound to the port with SO_REUSEPORT, so N processes use N cores with no proxy in
front. Each is a full router (its own app, event loop, health checks, engine scrapes):
with ``--redis-url`` they are replicas sharing residency and load through Redis, exactly
as routers on separate hosts are. Without Redis each process knows only what it routed
itself (its own residency, in-flight counts and /metrics), which the README says.

The parent only supervises: SIGINT/SIGTERM are passed on, and a child that dies takes the
others down with it (exit status 1), so whatever restarts the router sees one failure
rather than a server silently running on fewer cores.
"""

from __future__ import annotations

import multiprocessing
import signal
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess

from router.config import ConfigError, RouterConfig


def check(config: RouterConfig) -> None:
    """What several processes cannot share: an ephemeral port, one snapshot file."""
    if config.processes > 1 and config.port == 0:
        raise ConfigError("invalid config: processes: several processes need a fixed "
                          "--port to share (got port 0)")
    if config.processes > 1 and config.residency_snapshot:
        raise ConfigError("invalid config: processes: each process would overwrite the "
                          "others' --residency-snapshot; use --redis-url to share residency")


def run_processes(config: RouterConfig, child: Callable[[RouterConfig], None]) -> int:
    """Start ``config.processes`` children running ``child(config)``; wait for them."""
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no loop state copied
    children = [ctx.Process(target=child, args=(config,), name=f"prefix-router-{i}")
                for i in range(config.processes)]
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True
        for p in children:
            if p.is_alive() and p.pid is not None:
                p.terminate()  # SIGTERM: each child drains its in-flight requests

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        for p in children:
            p.start()
        while not stopping and all(p.is_alive() for p in children):
            time.sleep(0.2)
        failed = not stopping
        stop(signal.SIGTERM, None)
        for p in children:
            p.join(30)
            if p.is_alive():
                p.kill()
        return 1 if failed or any(_exitcode(p) for p in children) else 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _exitcode(p: BaseProcess) -> int:
    """A child stopped by our SIGTERM exits cleanly (0); anything else is a failure."""
    return 0 if p.exitcode in (0, -signal.SIGTERM) else 1
