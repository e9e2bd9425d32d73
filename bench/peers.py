"""The peer routers from PyPI (sglang-router, vllm-router), run from ``.venv-peers``.

They are Rust binaries behind a Python launcher; they are kept out of the project's venv
because they pull their own aiohttp/fastapi/pydantic versions. Install with:
``python -m venv .venv-peers && .venv-peers/bin/pip install sglang-router vllm-router``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from bench.fleet import REPO, Proc, free_port, launch

PEER_VENV = REPO / ".venv-peers"
PEERS = ("sglang_cache_aware", "vllm_cache_aware")


def available(name: str) -> bool:
    return (PEER_VENV / "bin" / _exe(name)).exists()


def _exe(name: str) -> str:
    return "sglang-router" if name.startswith("sglang") else "vllm-router"


def start_peer(name: str, worker_urls: Sequence[str], logdir: Path, *,
               policy: str = "cache_aware", cpus: set[int] | None = None) -> Proc:
    """Start a peer router with its documented defaults apart from the policy."""
    port = free_port()
    exe = str(PEER_VENV / "bin" / _exe(name))
    if name.startswith("sglang"):
        argv = [exe, "launch", "--log-level", "warn"]
    else:
        argv = [exe, "--log-level", "warning"]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--worker-urls", *worker_urls,
             "--policy", policy]
    return launch(name, argv, f"http://127.0.0.1:{port}", logdir, ready_path="/health",
                  cpus=cpus, timeout=90.0)
