"""`python -m engine_worker`: the same as the `prefix-worker` console script."""

import sys

from engine_worker.cli import main

sys.exit(main())
