"""`prefix-worker` / `python -m engine_worker`: start one vLLM worker for the prefix router.

Settings come from, in rising precedence: defaults, `--config FILE.yaml`
(or PREFIX_WORKER_CONFIG), PREFIX_WORKER_<SETTING> environment variables, and flags.
Arguments after `--` go to vLLM unchanged. `--dry-run` prints the environment and command
it would run and exits 0, so a deployment can be reviewed (and tested) without a GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence
from typing import Any

from engine_worker import config as worker_config
from engine_worker import vllm_check
from engine_worker.command import build
from engine_worker.launcher import launch


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="prefix-worker", description=__doc__.splitlines()[0],
        argument_default=argparse.SUPPRESS,  # only what was given overrides YAML/env
    )
    p.add_argument("--config", dest="config_file", help="YAML file of settings")
    p.add_argument("--model", help="model path or name for vLLM")
    p.add_argument("--served-model-name", nargs="+", help="name(s) clients use")
    p.add_argument("--host", help="vLLM bind address (default 0.0.0.0)")
    p.add_argument("--port", type=int, help="vLLM port (default 8000)")
    p.add_argument("--block-size", type=int, help="tokens per KV block (16; 32 on CPU)")
    p.add_argument("--gpu-memory-utilization", type=float, help="default 0.9")
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--max-num-seqs", type=int)
    p.add_argument("--enable-prefix-caching", action="store_true",
                   help="accepted for compatibility: prefix caching is always on")
    p.add_argument("--prefix-caching-hash-algo", choices=worker_config.HASH_ALGOS,
                   help="default sha256_cbor (reproducible by the router)")
    p.add_argument("--python-hash-seed", help="PYTHONHASHSEED for vLLM (default 0)")
    p.add_argument("--enable-prompt-tokens-details", action=argparse.BooleanOptionalAction,
                   help="report usage.prompt_tokens_details.cached_tokens (default on)")
    p.add_argument("--kv-events-endpoint", help="ZMQ PUB endpoint, e.g. tcp://*:5557")
    p.add_argument("--kv-events-replay-endpoint", help="ZMQ ROUTER endpoint, e.g. tcp://*:5558")
    p.add_argument("--kv-events-topic", help="default kv-events")
    p.add_argument("--lmcache-profile", help="LMCache YAML, e.g. lmcache_config/cpu-offload.yaml")
    p.add_argument("--device", choices=worker_config.DEVICES, help="cuda (default) or cpu")
    p.add_argument("--cpu-kvcache-space-gib", type=int,
                   help="KV cache GiB with --device cpu (VLLM_CPU_KVCACHE_SPACE, default 4)")
    p.add_argument("--register-redis", help="redis:// URL of the fleet registry")
    p.add_argument("--registry-prefix", help="registry key prefix")
    p.add_argument("--heartbeat-ttl-s", type=float)
    p.add_argument("--worker-id", help="default HOSTNAME-PORT")
    p.add_argument("--advertise-url", help="URL routers use (default http://FQDN:PORT)")
    p.add_argument("--python", help="interpreter that has vLLM (default: this one)")
    p.add_argument("--env", action="append", metavar="KEY=VALUE",
                   help="extra environment for vLLM (repeatable), e.g. LMCACHE_P2P_HOST=10.0.0.5")
    p.add_argument("--health-timeout-s", type=float)
    p.add_argument("--drain-grace-s", type=float)
    p.add_argument("--drain-timeout-s", type=float)
    p.add_argument("--stop-timeout-s", type=float)
    p.add_argument("--dry-run", action="store_true", help="print environment and command, exit")
    p.add_argument("--skip-vllm-check", action="store_true",
                   help="start even a vLLM whose KV events or block hashes are not the known "
                   f"ones (supported: vLLM {vllm_check.SUPPORTED}; precise routing would "
                   "then mispredict)")
    p.add_argument("--log-level", default="INFO")
    return p


def parse(argv: Sequence[str]) -> tuple[worker_config.WorkerConfig, argparse.Namespace]:
    argv = list(argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    args = parser().parse_args(argv)
    flags: dict[str, Any] = {k: v for k, v in vars(args).items()
                             if k not in ("config_file", "dry_run", "log_level",
                                          "skip_vllm_check")}
    flags.pop("enable_prefix_caching", None)
    if "env" in flags:
        bad = [item for item in flags["env"] if "=" not in item]
        if bad:
            raise SystemExit(f"--env expects KEY=VALUE, got {bad}")
        flags["env"] = dict(item.split("=", 1) for item in flags["env"])
    if extra:
        flags["extra_args"] = extra
    cfg = worker_config.load(flags, getattr(args, "config_file", None))
    return cfg, args


def main(argv: Sequence[str] | None = None) -> int:
    try:
        cfg, args = parse(sys.argv[1:] if argv is None else argv)
    except ValueError as exc:
        print(f"prefix-worker: {exc}", file=sys.stderr)
        return 2
    for warning in cfg.warnings():
        print(f"prefix-worker: warning: {warning}", file=sys.stderr)
    if getattr(args, "dry_run", False):
        print(build(cfg).render())
        print(f"# worker {cfg.effective_worker_id} url={cfg.public_url} "
              f"models={','.join(cfg.models)} block_size={cfg.effective_block_size} "
              f"kv_events={cfg.public_kv_events_endpoint or '-'} "
              f"register={cfg.register_redis or '-'}")
        return 0
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s prefix-worker %(message)s")
    return asyncio.run(launch(cfg, check_vllm=not getattr(args, "skip_vllm_check", False)))


if __name__ == "__main__":
    sys.exit(main())
