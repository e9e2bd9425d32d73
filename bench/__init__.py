"""prefix-router benchmarks: workloads, a fleet runner, policy comparisons, overhead, scale.

Everything here measures what a user buys a prefix router for (hit rate, TTFT,
throughput, balance, overhead) on the simulated fleet in engine_worker/sim.
"""
