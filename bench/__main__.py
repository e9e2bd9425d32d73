"""``python -m bench``: see bench/cli.py."""

from bench.cli import main

main()
