"""Signals, one module each; a policy names the ones it reads in ``needs``.

Adding a signal: write ``signals/<name>.py`` with a class that has ``name`` and
``async annotate(request, candidates)``, and add one line to ``SIGNALS`` below, in the
order it must run (a signal may read what earlier ones wrote).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from router.routing.signals.base import Signal, SignalContext
from router.routing.signals.load import LoadSignal
from router.routing.signals.residency import ResidencySignal
from router.routing.signals.ttft import TTFTSignal

SIGNALS: dict[str, Callable[[SignalContext], Signal]] = {
    "residency": ResidencySignal,
    "load": LoadSignal,
    "ttft": TTFTSignal,  # reads residency and load
}


def build_signals(needs: Iterable[str], context: SignalContext) -> list[Signal]:
    """The signals a policy needs, in registry order."""
    wanted = set(needs)
    unknown = wanted - SIGNALS.keys()
    if unknown:
        raise ValueError(f"unknown signals: {', '.join(sorted(unknown))}")
    return [make(context) for name, make in SIGNALS.items() if name in wanted]


__all__ = ["SIGNALS", "Signal", "SignalContext", "build_signals"]
