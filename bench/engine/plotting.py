"""Plots of the engine claims: lines or grouped bars, always titled, unit-labelled, legended."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from bench.engine.common import RESULTS


def _save(fig: plt.Figure, name: str) -> str:
    RESULTS.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(RESULTS / name, dpi=110)
    plt.close(fig)
    return name


def line_plot(name: str, series: Mapping[str, tuple[Sequence[float], Sequence[float]]], *,
              title: str, xlabel: str, ylabel: str, logx: bool = False,
              logy: bool = False) -> str:
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for label, (xs, ys) in series.items():
        ax.plot(xs, ys, marker="o", label=label)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_title("\n".join(textwrap.wrap(title, 90)), fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, name)


def bar_plot(name: str, groups: Sequence[str], bars: Mapping[str, Sequence[float]], *,
             title: str, xlabel: str, ylabel: str, logy: bool = False) -> str:
    fig, ax = plt.subplots(figsize=(9, 5.5))
    x = np.arange(len(groups))
    width = 0.8 / max(1, len(bars))
    for i, (label, vals) in enumerate(bars.items()):
        ax.bar(x + i * width, vals, width, label=label)
    ax.set_xticks(x + 0.4 - width / 2, groups, fontsize=8)
    if logy:
        ax.set_yscale("log")
    ax.set_title("\n".join(textwrap.wrap(title, 90)), fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, name)
