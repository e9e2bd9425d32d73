"""``python -m engine_worker.sim``."""

from engine_worker.sim.cli import main

main()
