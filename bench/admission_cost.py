"""``python -m bench.admission_cost``: what admission adds to a request when nothing waits.

The fast path of ``Admission.arrive`` (no queue, a worker with room: dispatch now) timed in
process at several fleet sizes, so the cost is read without the noise of HTTP on a shared
machine; compare with the ~1-2 ms a request spends in the router (bench/README.md, Overhead).
"""

from __future__ import annotations

import asyncio
import time

from prometheus_client import CollectorRegistry

from router.admission.controller import Admission, AdmissionSettings
from router.admission.metrics import AdmissionMetrics
from router.fleet.workers import Worker

SETTINGS = AdmissionSettings(2.0, 0.5, 0.95, 1024, 4_000_000, 2048)


async def per_call_us(workers: int, calls: int = 20_000) -> float:
    pool = [Worker(id=f"w{i}", url=f"http://w{i}", healthy=True) for i in range(workers)]
    control = Admission(SETTINGS, lambda model: pool, AdmissionMetrics(CollectorRegistry()))
    started = time.process_time()  # CPU time: this box is shared
    for _ in range(calls):
        assert control.arrive("m", "tenant", 0, 1000.0) is None
    return (time.process_time() - started) / calls * 1e6


async def main() -> None:
    print("| workers | admission fast path, CPU µs per request |\n|---|---|")
    for workers in (1, 8, 64):
        print(f"| {workers} | {await per_call_us(workers):.1f} |")


if __name__ == "__main__":
    asyncio.run(main())
