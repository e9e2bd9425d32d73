"""Workload generators: each returns a deterministic list of ``BenchRequest`` given a seed."""

from __future__ import annotations

from typing import Any

from bench.workloads import agentic, mooncake, multiturn, rag
from bench.workloads.base import BenchRequest

WORKLOADS = ("rag", "mooncake", "multiturn", "agentic")


def make_workload(name: str, **opts: Any) -> list[BenchRequest]:
    """Build a workload from keyword options (unknown or None options keep their default)."""
    module, cls = {"rag": (rag, rag.RagConfig), "mooncake": (mooncake, mooncake.MooncakeConfig),
                   "multiturn": (multiturn, multiturn.MultiturnConfig),
                   "agentic": (agentic, agentic.AgenticConfig)}[name]
    fields = cls.__dataclass_fields__
    cfg = cls(**{k: v for k, v in opts.items() if k in fields and v is not None})
    return module.generate(cfg)


__all__ = ["WORKLOADS", "BenchRequest", "make_workload"]
