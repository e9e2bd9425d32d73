"""One request waiting for capacity, as the admission queue holds it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field


@dataclass(eq=False, slots=True)
class Ticket:
    """``cost`` is what fairness charges: the request's predicted uncached prompt tokens
    (a tenant whose prompts hit the cache costs the fleet less and is charged less)."""

    model: str
    tenant: str
    priority: int  # vLLM's convention: lower is served first
    cost: float
    arrived: float  # monotonic seconds
    deadline: float
    granted: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())
    queued: bool = True  # False once popped for dispatch or removed
