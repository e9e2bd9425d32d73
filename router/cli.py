"""``prefix-router serve`` (and ``epp``, ``demo``): start the gateway, or the endpoint picker
behind an Envoy gateway; bad config is one clear line."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence

from aiohttp import web

from router.config import ConfigError, RouterConfig, add_arguments, load_config
from router.infra.logs import configure as configure_logging
from router.server.app import build_app
from router.server.edge import EdgeRunner, edge_options
from router.server.upstream import load_upstream

log = logging.getLogger("router")


async def serve(config: RouterConfig, stop: asyncio.Event | None = None,
                build: Callable[[RouterConfig], web.Application] = build_app) -> None:
    """Serve until SIGINT/SIGTERM (or ``stop``); in-flight requests get time to finish."""
    app = build(config)
    runner = EdgeRunner(app, handler_cancellation=True, access_log=None, **edge_options(config))
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port, backlog=1024, reuse_address=True,
                       reuse_port=config.processes > 1 or None)
    await site.start()
    log.info("prefix-router listening on http://%s:%d (policy=%s, workers=%d, residency=%s)",
             config.host, config.port, config.policy, len(config.workers),
             "redis" if config.redis_url else "memory")
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def _run(coro: object) -> None:
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)  # type: ignore[arg-type]
    else:
        uvloop.run(coro)  # type: ignore[arg-type]


def serve_one(config: RouterConfig) -> None:
    """One of ``--processes`` (a spawned child: logging is set up again here)."""
    configure_logging(config.log_level, config.log_format)
    _run(serve(config))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="prefix-router", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve_cmd = commands.add_parser("serve", help="run the gateway")
    add_arguments(serve_cmd)
    epp_cmd = commands.add_parser("epp", help="run as the endpoint picker (ext_proc) of an "
                                  "Envoy gateway; HTTP keeps /metrics, /health, /ready, /admin")
    add_arguments(epp_cmd)
    demo_cmd = commands.add_parser("demo", help="run the gateway in front of a local "
                                   "simulated fleet and show requests being routed")
    demo_cmd.add_argument("--workers", type=int, default=3, help="simulated workers to start")
    demo_cmd.add_argument("--port", type=int,
                          default=int(os.environ.get("PREFIX_ROUTER_PORT", "8000")))
    args = parser.parse_args(argv)
    if args.command == "demo":
        from router.demo import run_demo

        logging.basicConfig(level=logging.WARNING, format="%(message)s")
        _run(run_demo(args.workers, args.port))
        return 0
    try:
        config = load_config(vars(args))
        load_upstream(config)  # the CA bundle and key files, read once to fail here
    except ConfigError as exc:
        print(f"prefix-router: {exc}", file=sys.stderr)
        return 2
    if args.command == "serve" and config.processes > 1:
        from router.server.processes import check, run_processes

        try:
            check(config)
        except ConfigError as exc:
            print(f"prefix-router: {exc}", file=sys.stderr)
            return 2
        return run_processes(config, serve_one)
    configure_logging(config.log_level, config.log_format)
    if args.command == "epp":
        from router.epp.app import build_picker_app  # needs the 'epp' extra (grpcio)

        _run(serve(config, build=build_picker_app))
        return 0
    _run(serve(config))
    return 0
