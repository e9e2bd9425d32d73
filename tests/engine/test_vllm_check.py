"""prefix-worker refuses a vLLM whose KV events or block hashes it does not know (issue 16,
item 6). The real vLLM passes the same check each time the engine tests' fleet starts
(tests/engine/test_api_vllm.py reads the worker's log line)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from engine_worker import vllm_check
from router.protocol.block_hash import block_hashes
from router.protocol.kv_events import STORED_FIELDS
from tests.engine.test_launcher import FAKE_VLLM
from tests.support import REPO, free_port

KNOWN = tuple(h.hex() for h in block_hashes(list(range(64)), 32, seed="0",
                                            cache_salt=vllm_check.PROBE_SALT))


def test_the_known_formats_pass() -> None:
    vllm_check.check(vllm_check.Probe("0.32.0", (*STORED_FIELDS, "new_field"), KNOWN), "0")


def test_another_event_layout_is_refused_by_name() -> None:
    fields = tuple(f for f in STORED_FIELDS if f != "medium")
    with pytest.raises(vllm_check.UnknownVllm, match=r"vLLM 0\.99 publishes BlockStored"):
        vllm_check.check(vllm_check.Probe("0.99", fields, KNOWN), "0")


def test_another_hash_scheme_is_refused() -> None:
    unsalted = tuple(h.hex() for h in block_hashes(list(range(64)), 32, seed="0"))
    with pytest.raises(vllm_check.UnknownVllm, match="hashes KV blocks differently"):
        vllm_check.check(vllm_check.Probe("0.10", STORED_FIELDS, unsalted), "0")


def test_prefix_worker_refuses_a_vllm_without_those_interfaces() -> None:
    """The fake engine starts and answers /health, but never gets registered: the check
    runs while it loads and stops it."""
    done = subprocess.run(
        [sys.executable, "-m", "engine_worker", "--model", "fake", "--python", sys.executable,
         "--host", "127.0.0.1", "--port", str(free_port()), "--kv-events-endpoint",
         f"tcp://*:{free_port()}", "--health-timeout-s", "60", "--env",
         f"PYTHONPATH={FAKE_VLLM}"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert done.returncode == vllm_check.REFUSED, done.stderr
    assert "does not have the KV-event and block-hash interfaces of vLLM 0.32.x" in done.stderr
