"""``python -m bench.profile_hop [POLICY] [REQUESTS]``: where the router's CPU goes per request.

The overhead bench's closed loop (c=16, 4 KB completions, non-streamed) against its instant
upstream, with py-spy (``pip install py-spy``) sampling the router at 500 Hz. The upstream
and the load generator share CPU 0 and the router has CPU 1 alone, so the router's samples
are its own CPU time. Prints the functions with the most samples, by self and total time.
"""

from __future__ import annotations

import asyncio
import collections
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench import fleet, overhead


def _frame(frame: str) -> str:
    """``name (path/to/file.py:123)`` -> ``name (file.py)``."""
    name, _, where = frame.partition(" (")
    return f"{name} ({where.split(':')[0].rsplit('/', 1)[-1]})" if where else name


def summarize(raw: Path, top: int = 25) -> str:
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = [_frame(f) for f in stack.split(";")]
        samples += int(count)
        own[frames[-1]] += int(count)
        for name in set(frames):
            total[name] += int(count)
    out = [f"{samples} samples", "self:"]
    out += [f"  {100 * n / samples:5.1f}% {name}" for name, n in own.most_common(top)]
    out.append("total:")
    out += [f"  {100 * n / samples:5.1f}% {name}" for name, n in total.most_common(top)]
    return "\n".join(out)


def main() -> None:
    policy = sys.argv[1] if len(sys.argv) > 1 else "prefix_aware"
    requests = int(sys.argv[2]) if len(sys.argv) > 2 else 6000
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    logdir = Path("/tmp/prefix-router-bench") / f"profile-{int(time.time())}"
    raw = logdir / f"{policy}.raw"
    os.sched_setaffinity(0, {0})
    port = fleet.free_port()
    up = fleet.launch("upstream", [sys.executable, "-m", "bench.upstream", str(port)],
                      f"http://127.0.0.1:{port}", logdir, cpus={0})
    router = fleet.start_router([up.url], policy, logdir, cpus={1})
    try:
        asyncio.run(overhead._cell(router.url, 16, 200, False))  # warm
        sampler = subprocess.Popen([spy, "record", "-r", "500", "-f", "raw", "-o", str(raw),
                                    "--pid", str(router.popen.pid), "--nonblocking"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)
        cpu0 = fleet.cpu_seconds(router.popen.pid)
        cell = asyncio.run(overhead._cell(router.url, 16, requests, False))
        cpu = (fleet.cpu_seconds(router.popen.pid) - cpu0) / (cell["n"] + 50) * 1e6
        sampler.send_signal(2)
        sampler.wait(30)
    finally:
        router.stop()
        up.stop()
    print(f"{policy}: {cell['rps']:.0f} req/s, router CPU {cpu:.0f} µs/request; {raw}")
    print(summarize(raw))


if __name__ == "__main__":
    main()
