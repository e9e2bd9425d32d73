"""Validate LMCache profiles with LMCache's own loader; run it in the engine's environment.

Usage: .venv-engine/bin/python scripts/check_lmcache_profile.py lmcache_config/*.yaml

Why a script and not an import in the tests: LMCache pins numpy/prometheus-client versions
that the router's environment must not take, so the tests call this file with the engine
venv's interpreter. It loads each file the way LMCache's vLLM connector does
(``load_engine_config_with_overrides``: file, then LMCACHE_* environment, then
``validate()``), and also fails on keys LMCache would only warn about and then ignore
(a typo in a profile would otherwise silently fall back to a default). Remote URLs are
parsed with LMCache's own URL parser. Prints one JSON object per file; exits 1 on any error.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import yaml
from lmcache.v1.config import (
    _CONFIG_ALIASES,
    _CONFIG_DEFINITIONS,
    load_engine_config_with_overrides,
)
from lmcache.v1.storage_backend.connector import parse_remote_url


def check(path: str) -> dict[str, Any]:
    """Load one profile; return a summary of the settings that matter for sizing."""
    with open(path) as fin:
        raw = yaml.safe_load(fin) or {}
    unknown = sorted(set(raw) - set(_CONFIG_DEFINITIONS) - set(_CONFIG_ALIASES))
    if unknown:
        raise ValueError(f"unknown LMCache keys (LMCache would ignore them): {unknown}")
    config = load_engine_config_with_overrides(config_file_path=path)
    if config.remote_url:
        parsed = parse_remote_url(config.remote_url)
        remote: str | None = f"{parsed.host}:{parsed.port}"
    else:
        remote = None
    return {
        "file": path,
        "ok": True,
        "chunk_size": config.chunk_size,
        "local_cpu": config.local_cpu,
        "max_local_cpu_size_gb": config.max_local_cpu_size,
        "local_disk": config.local_disk,
        "max_local_disk_size_gb": config.max_local_disk_size,
        "remote_url": config.remote_url,
        "remote": remote,
        "enable_controller": config.enable_controller,
        "enable_p2p": config.enable_p2p,
        "keys": sorted(raw),
    }


def main(paths: list[str]) -> int:
    status = 0
    for path in paths:
        try:
            print(json.dumps(check(path)), flush=True)
        except Exception as exc:  # noqa: BLE001 - report every file, then fail
            print(json.dumps({"file": path, "ok": False, "error": f"{type(exc).__name__}: {exc}"}),
                  flush=True)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
