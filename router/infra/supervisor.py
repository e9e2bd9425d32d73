"""Background loops that cannot die silently: each runs supervised and restarts with backoff.

Why: a loop that raises once (a worker's garbage answer, a bug on a rare path) would end its
task unobserved, and whatever it keeps current (health, discovery, shared load, KV events)
would freeze for the whole fleet while requests still flow. Under a supervisor the
exception is logged with its traceback, counted in
``prefix_router_background_errors_total{task}``, and the loop is started again after a
capped exponential backoff (reset once a run outlived the longest backoff), so a
persistent fault costs one log line every few seconds, not a busy loop.

Cleanup contexts start their loops here and stop them on the way out, in their own order;
the app's last cleanup step closes whatever is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from prometheus_client import Counter

log = logging.getLogger(__name__)

Factory = Callable[[], Awaitable[None]]


class Supervisor:
    """Named background tasks of one app, each restarted after an exception."""

    def __init__(self, errors: Counter | None = None, *, initial_backoff_s: float = 0.1,
                 max_backoff_s: float = 5.0) -> None:
        self._errors = errors  # labelled by task
        self._initial_backoff_s = initial_backoff_s
        self._max_backoff_s = max_backoff_s
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def start(self, name: str, factory: Factory, *, label: str | None = None) -> None:
        """Run ``factory()`` until it returns or is cancelled, restarting it when it raises.

        ``label`` is the metric's ``task`` label (default: the name), so per-worker tasks
        can share one series instead of leaving one behind for every worker ever seen."""
        if name in self._tasks:
            raise ValueError(f"background task {name!r} is already running")
        task = asyncio.create_task(self._supervise(name, factory, label or name), name=name)
        self._tasks[name] = task
        task.add_done_callback(lambda done: self._forget(name, done))

    def cancel(self, name: str) -> asyncio.Task[None] | None:
        """Cancel one task without waiting (for synchronous callers); the task, if any."""
        task = self._tasks.pop(name, None)
        if task is not None:
            task.cancel()
        return task

    async def stop(self, name: str) -> None:
        """Cancel one task and wait until it has finished."""
        await _reap([t] if (t := self.cancel(name)) is not None else [])

    async def close(self) -> None:
        """Cancel every task and wait for them all."""
        await _reap([t for name in list(self._tasks) if (t := self.cancel(name)) is not None])

    def names(self) -> list[str]:
        return list(self._tasks)

    def _forget(self, name: str, done: asyncio.Task[None]) -> None:
        if self._tasks.get(name) is done:
            del self._tasks[name]

    async def _supervise(self, name: str, factory: Factory, label: str) -> None:
        loop = asyncio.get_running_loop()
        backoff = self._initial_backoff_s
        while True:
            started = loop.time()
            try:
                await factory()
            except Exception:
                if loop.time() - started >= self._max_backoff_s:
                    backoff = self._initial_backoff_s  # it ran fine for a while: a new fault
                log.exception("background task %s failed; restarting in %.1f s", name, backoff)
                if self._errors is not None:
                    self._errors.labels(label).inc()
            else:
                log.info("background task %s finished", name)
                return
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self._max_backoff_s)


async def _reap(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


SUPERVISOR = web.AppKey("supervisor", Supervisor)


async def supervisor_ctx(app: web.Application) -> AsyncIterator[None]:
    """First cleanup context, so its exit runs last: stops any task a context left behind."""
    yield
    await app[SUPERVISOR].close()
