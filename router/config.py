"""Router configuration: one dataclass, read from flags > PREFIX_ROUTER_* env > YAML > defaults.

Every field is a flag (``--bound-epsilon``), an env var (``PREFIX_ROUTER_BOUND_EPSILON``) and
a YAML key (``bound_epsilon``). Invalid values fail at start with one line naming the field.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

import yaml

ENV_PREFIX = "PREFIX_ROUTER_"
# the policies router/routing/policies builds (make_policy); named here so the config, the
# lowest room but one, imports nothing of the router
POLICY_NAMES = ("predicted_ttft", "prefix_aware", "consistent_hash", "least_loaded",
                "round_robin", "llmd_weighted")

# the URL schemes router/infra/redis_client.py builds a client for
REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster",
                 "redis+sentinel", "rediss+sentinel")


class ConfigError(ValueError):
    """Raised with a message naming the bad field."""


def _opt(default: Any, help: str, check: Callable[[Any], bool] | None = None,
         rule: str = "", secret: bool = False) -> Any:
    """One setting; a ``secret`` one is left out of the config's repr (and so of logs)."""
    return field(default=default, repr=not secret,
                 metadata={"help": help, "check": check, "rule": rule})


_POSITIVE = (lambda v: v > 0, "must be > 0")
_NON_NEGATIVE = (lambda v: v >= 0, "must be >= 0")


@dataclass(frozen=True)
class RouterConfig:
    host: str = _opt("127.0.0.1", "address to listen on (0.0.0.0 in a cluster)")
    port: int = _opt(8000, "port to listen on", lambda v: 0 <= v < 65536, "must be a TCP port")
    processes: int = _opt(1, "router processes on the one port (SO_REUSEPORT); they share "
                          "residency and load only through --redis-url", *_POSITIVE)
    workers: tuple[tuple[str, str], ...] = _opt(
        (), "upstream workers: URL[,URL...] or NAME=URL[,...]; ids default to w0, w1, ...")
    policy: str = _opt("predicted_ttft", "routing policy: " + ", ".join(POLICY_NAMES),
                       lambda v: v in POLICY_NAMES, "must be one of " + ", ".join(POLICY_NAMES))
    redis_url: str = _opt("", "Redis for shared residency/registry/load (empty: in memory): "
                          "redis://, rediss://, unix://, redis+cluster://H:P[,H:P] or "
                          "redis+sentinel://H:P[,H:P]/SERVICE",
                          lambda v: v == "" or v.split("://", 1)[0] in REDIS_SCHEMES,
                          "must be one of " + ", ".join(s + "://" for s in REDIS_SCHEMES))
    redis_key_prefix: str = _opt("prefix-router:", "namespace prefix of every Redis key",
                                 lambda v: "{" not in v and "}" not in v,
                                 "must not hold braces (they would become the keys' hash tag)")
    redis_timeout_ms: float = _opt(20.0, "per-call Redis timeout on the request path", *_POSITIVE)
    residency_ttl_s: float = _opt(3600.0, "TTL of residency entries in Redis", *_POSITIVE)
    otel_endpoint: str = _opt("", "OTLP/HTTP traces endpoint, e.g. http://collector:4318/v1/traces "
                              "(empty: tracing off; needs the 'otel' extra)")
    otel_service_name: str = _opt("prefix-router", "service.name of the router's spans")
    responses_ttl_s: float = _opt(86400.0, "how long the worker that made a Responses API "
                                  "response id is remembered (memory, and Redis when set)",
                                  *_POSITIVE)
    discover: bool = _opt(False, "also take workers from the Redis registry")
    registry_poll_s: float = _opt(1.0, "how often to re-read the Redis registry", *_POSITIVE)
    load_publish_s: float = _opt(0.25, "how often to publish/read in-flight counts", *_POSITIVE)
    scrape_interval_s: float = _opt(1.0, "how often to scrape workers' vllm:num_requests_*",
                                    *_NON_NEGATIVE)
    block_chars: int = _opt(256, "prompt block size for the hash chain, in UTF-8 bytes",
                            *_POSITIVE)
    max_blocks: int = _opt(256, "chain blocks of block_chars bytes per request; after them "
                           "up to as many 16 times as long", *_POSITIVE)
    key_blocks: int = _opt(32, "ring key = chain link at block min(n, key_blocks)", *_POSITIVE)
    bound_epsilon: float = _opt(0.25, "load bound slack: bound = ceil((1+eps)(L+1)/n); "
                                "predicted_ttft starts a new context only on a worker whose "
                                "recent prefill work is within (1+eps) of the fleet's mean",
                                *_POSITIVE)
    bound_margin: int = _opt(4, "predicted_ttft: requests allowed over the load bound (keeps "
                             "a conversation on its worker at low concurrency)", *_NON_NEGATIVE)
    slack_s: float = _opt(0.05, "predicted_ttft: a context leaves its home only for a worker "
                          "predicted faster by this many seconds ...", *_NON_NEGATIVE)
    slack_ratio: float = _opt(0.25, "predicted_ttft: ... plus this share of its predicted TTFT "
                              "(less for a move off a warm prefix under half the prompt)",
                              *_NON_NEGATIVE)
    cold_slack_s: float = _opt(0.01, "predicted_ttft: a context no worker holds starts on its "
                               "ring owner unless another starts it this much sooner",
                               *_NON_NEGATIVE)
    cold_slack_ratio: float = _opt(0.05, "predicted_ttft: ... plus this share of the other's "
                                   "predicted start", *_NON_NEGATIVE)
    replicate_cost: float = _opt(1.0, "predicted_ttft: weight of the prefill a new replica "
                                 "adds to the fleet, against the time it saves", *_NON_NEGATIVE)
    copy_share: float = _opt(0.005, "predicted_ttft: a context that is not hot may be copied "
                             "off a slow warm worker when the copy takes at most this share "
                             "of the other worker's KV cache", *_NON_NEGATIVE)
    copy_evict_cost: float = _opt(1.0, "predicted_ttft: a larger copy of a context that is "
                                  "not hot also pays this many times its own prefill, for "
                                  "what it evicts on the other worker", *_NON_NEGATIVE)
    hot_requests: int = _opt(3, "predicted_ttft: requests within replica_idle_s that make a "
                             "context hot enough to copy to a second worker", *_POSITIVE)
    replica_idle_s: float = _opt(30.0, "predicted_ttft: a context's replica unused this long "
                                 "stops counting as its home", *_POSITIVE)
    prefill_rate: float = _opt(20000.0, "prefill tokens/s assumed for a worker before it has "
                               "answered (then learned from its answers)", *_POSITIVE)
    offload_weight: float = _opt(0.9, "precise mode: a block in an offload tier (CPU, disk) "
                                 "counts as this share of a cached block",
                                 lambda v: 0 <= v <= 1, "must be in [0, 1]")
    attention_tokens: float = _opt(32768.0, "predicted TTFT: context length at which a "
                                   "token's attention costs what its pass through the "
                                   "weights does, params / (2 x layers x width): ~30 k for "
                                   "Llama-3-8B, ~53 k for 70B; 0 prices prefill linearly",
                                   *_NON_NEGATIVE)
    queue_drain: bool = _opt(True, "predicted TTFT: a worker's queue drains at its learned "
                             "rate between the answers that say where its engine is")
    prefill_chunk_tokens: int = _opt(8192, "predicted_ttft: the engines' prefill step "
                                     "(vLLM's --max-num-batched-tokens), to price the delay "
                                     "a request causes the prompt queued before it; 0 off",
                                     *_NON_NEGATIVE)
    prefill_gate_ms: float = _opt(30.0, "predicted_ttft: a stream whose first tokens would "
                                  "fill the step finishing the prompt queued before it on "
                                  "its worker, delaying that prompt's first token by more "
                                  "than this, waits here until that prompt has its first "
                                  "byte; 0 off", *_NON_NEGATIVE)
    decode_penalty_ms: float = _opt(1.0, "predicted TTFT added per request decoding on the "
                                    "worker", *_NON_NEGATIVE)
    shortlist_size: int = _opt(64, "predicted_ttft: a fleet of more workers is weighed by a "
                               "shortlist (those holding the prompt, the key's ring nodes, "
                               "8 sampled) rather than worker by worker", *_POSITIVE)
    min_match: int = _opt(1, "blocks a resident prefix must cover to count as warm", *_POSITIVE)
    warm_ratio: float = _opt(0.5, "share of a prompt's blocks a worker must hold for residency "
                             "to override the ring", lambda v: 0 < v <= 1, "must be in (0, 1]")
    residency_capacity: int = _opt(65536, "tracked blocks per worker when it reports none "
                                   "(head blocks: a tail link counts 16)", *_POSITIVE)
    residency_snapshot: str = _opt("", "without Redis: file the in-memory residency is saved to "
                                   "(on shutdown and periodically) and loaded from at start")
    residency_snapshot_interval_s: float = _opt(300.0, "how often to save the residency "
                                                "snapshot", *_POSITIVE)
    residency_snapshot_ttl_s: float = _opt(1800.0, "a residency snapshot older than this is "
                                           "ignored at start", *_POSITIVE)
    lora_adapters: tuple[tuple[str, str], ...] = _opt(
        (), "LoRA adapters the router may load on a worker when none has it, NAME=PATH[,...] "
        "(vLLM's /v1/load_lora_adapter; empty: never loads)")
    tokenizers: tuple[tuple[str, str], ...] = _opt(
        (), "precise mode: local tokenizer per model, MODEL=DIR[,MODEL=DIR] (needs the "
        "'precise' extra)")
    kv_events: tuple[tuple[str, str], ...] = _opt(
        (), "precise mode: KV events of static workers, NAME=tcp://HOST:PORT[|REPLAY_URL]"
        "[,...] (registry workers advertise theirs)")
    kv_events_topic: str = _opt("kv-events", "ZMQ topic of static workers' KV events")
    precise_block_size: int = _opt(16, "vLLM block size of static workers (tokens)",
                                   *_POSITIVE)
    precise_hash_seed: str = _opt("0", "PYTHONHASHSEED of static workers (seeds block hashes)")
    connect_timeout_s: float = _opt(2.0, "upstream connect timeout", *_POSITIVE)
    first_byte_timeout_s: float = _opt(120.0, "upstream time to response headers", *_POSITIVE)
    idle_timeout_s: float = _opt(120.0, "upstream silence allowed between chunks", *_POSITIVE)
    upstream_ca_file: str = _opt("", "PEM CA bundle that verifies https:// workers (their "
                                 "health probes and scrapes too), in place of the system "
                                 "trust store (empty: the system's)")
    upstream_api_keys_file: str = _opt("", "file of API keys presented to workers (vLLM "
                                       "--api-key), one a line: 'WORKER KEY' (id or URL), "
                                       "'* KEY' (every other worker) or 'KEY' (named by "
                                       "fingerprint in a registry record); a worker with a "
                                       "key gets 'Authorization: Bearer KEY' in place of the "
                                       "client's")
    upstream_api_key: str = _opt("", "API key presented to every worker without its own "
                                 "(prefer the env var or the keys file: a flag shows in ps)",
                                 secret=True)
    retry_attempts: int = _opt(3, "workers tried per request before giving up", *_POSITIVE)
    stream_resumes: int = _opt(2, "times a stream broken after its first byte is continued on "
                               "another worker (0: never, it ends with an error event: for "
                               "output that must come from one engine)", *_NON_NEGATIVE)
    hedge_share: float = _opt(0.0, "share of requests that may also go to the next worker "
                              "when their first byte is late (0: never hedge)",
                              lambda v: 0 <= v <= 1, "must be in [0, 1]")
    hedge_factor: float = _opt(4.0, "a first byte is late after this many times the "
                               "request's predicted TTFT (predicted_ttft policy)", *_POSITIVE)
    retry_backoff_s: float = _opt(0.02, "base of the jittered backoff between tries",
                                  *_NON_NEGATIVE)
    max_body_bytes: int = _opt(32 * 1024 * 1024, "largest request body accepted", *_POSITIVE)
    health_interval_s: float = _opt(2.0, "active /health check period", *_POSITIVE)
    health_timeout_s: float = _opt(1.0, "active /health check timeout", *_POSITIVE)
    breaker_threshold: int = _opt(3, "consecutive failures that open a worker's breaker",
                                  *_POSITIVE)
    breaker_cooldown_s: float = _opt(5.0, "open breaker waits this long before a probe",
                                     *_POSITIVE)
    admission: bool = _opt(False, "overload control: queue in the router past the engines' "
                           "allowance, 429 with Retry-After past --max-queue-wait-s")
    max_queue_wait_s: float = _opt(2.0, "admission: wait a request may get before its prefill "
                                   "starts (router queue + engine queue)", *_POSITIVE)
    engine_queue_s: float = _opt(0.5, "admission: predicted prefill backlog a worker may hold "
                                 "before requests wait in the router", *_NON_NEGATIVE)
    saturation_kv: float = _opt(0.95, "admission: KV-cache usage past which a worker takes no "
                                "more", lambda v: 0 < v <= 1, "must be in (0, 1]")
    max_queue_requests: int = _opt(1024, "admission: requests the queue of one model holds",
                                   *_POSITIVE)
    max_queue_tokens: int = _opt(4_000_000, "admission: uncached prompt tokens the queue of "
                                 "one model holds", *_POSITIVE)
    fair_quantum_tokens: int = _opt(2048, "admission: DRR quantum, uncached tokens a tenant "
                                    "earns per turn", *_POSITIVE)
    queue_keepalive_s: float = _opt(10.0, "admission: a queued stream gets an SSE comment this "
                                    "often", *_POSITIVE)
    tenant_from: str = _opt("header", "admission: tenant from the tenant header, else the API "
                            "key (header), or from the API key only (api_key)",
                            lambda v: v in ("header", "api_key"), "must be header or api_key")
    tenant_header: str = _opt("X-Tenant", "admission: header naming the tenant")
    tenant_requests_per_s: float = _opt(0.0, "admission: per-tenant request rate limit "
                                        "(0: none), shared through Redis", *_NON_NEGATIVE)
    tenant_tokens_per_s: float = _opt(0.0, "admission: per-tenant uncached prompt tokens/s "
                                      "limit (0: none), shared through Redis", *_NON_NEGATIVE)
    tenant_burst_s: float = _opt(2.0, "admission: a tenant's bucket holds this many seconds "
                                 "of its rate", *_POSITIVE)
    limits_sync_s: float = _opt(0.1, "admission: how often limits are synced through Redis",
                                *_POSITIVE)
    router_headers: bool = _opt(True, "add X-Prefix-Router-Worker/-Reason/-Predicted-TTFT-Ms "
                                "to responses")
    admin_token: str = _opt("", "bearer token for /admin (empty: admin routes are off)",
                            secret=True)
    client_timeout_s: float = _opt(30.0, "a client must send a request's head, and then its "
                                   "body, within this long (slow clients are cut off); also "
                                   "the idle keep-alive timeout", *_POSITIVE)
    max_header_bytes: int = _opt(8190, "longest request line or header line accepted",
                                 *_POSITIVE)
    max_headers: int = _opt(100, "most request headers accepted", *_POSITIVE)
    epp_port: int = _opt(9002, "endpoint-picker mode (prefix-router epp): ext_proc gRPC port",
                         lambda v: 0 <= v < 65536, "must be a TCP port")
    epp_fail_open: bool = _opt(False, "endpoint-picker mode: on a picker fault, let the gateway "
                               "place the request itself (else a 503)")
    epp_observe_grace_s: float = _opt(5.0, "endpoint-picker mode with Envoy's observer "
                                      "filter: how long after a request's end its observed "
                                      "response body may still arrive before the request's "
                                      "accounting ends without it", *_POSITIVE)
    inference_pool: str = _opt("", "endpoint-picker mode: take workers from the ready pods of "
                               "this InferencePool, read from the Kubernetes API")
    kube_api_url: str = _opt("", "Kubernetes API server (empty: in-cluster, from "
                             "KUBERNETES_SERVICE_HOST)")
    kube_namespace: str = _opt("", "namespace of the InferencePool (empty: the pod's own)")
    log_level: str = _opt("info", "debug, info, warning or error",
                          lambda v: v in ("debug", "info", "warning", "error"),
                          "must be debug, info, warning or error")
    log_format: str = _opt("json", "json (one object per line) or text",
                           lambda v: v in ("json", "text"), "must be json or text")


def parse_workers(value: str | Sequence[Any]) -> tuple[tuple[str, str], ...]:
    """'URL,URL' or 'NAME=URL,...' (or a YAML list of either / of {id, url}) -> ((id, url), ...)."""
    items = [p.strip() for p in value.split(",")] if isinstance(value, str) else list(value)
    out: list[tuple[str, str]] = []
    for index, item in enumerate(i for i in items if i):
        if isinstance(item, Mapping):
            worker_id, url = str(item.get("id", f"w{index}")), str(item["url"])
        elif "=" in item:
            worker_id, url = item.split("=", 1)
        else:
            worker_id, url = f"w{index}", item
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"invalid config: workers: {url!r} is not an http(s) URL")
        out.append((worker_id.strip(), url.rstrip("/")))
    if len({w for w, _ in out}) != len(out):
        raise ConfigError("invalid config: workers: duplicate worker id")
    return tuple(out)


def parse_pairs(name: str, value: str | Sequence[Any] | Mapping[str, Any]
                ) -> tuple[tuple[str, str], ...]:
    """'A=x,B=y' (or a YAML mapping / list of 'A=x') -> (('A', 'x'), ('B', 'y'))."""
    if isinstance(value, Mapping):
        items = [f"{k}={v}" for k, v in value.items()]
    elif isinstance(value, str):
        items = [p.strip() for p in value.split(",")]
    else:
        items = [str(i).strip() for i in value]
    out: list[tuple[str, str]] = []
    for item in (i for i in items if i):
        key, sep, val = item.partition("=")
        if not sep or not key.strip() or not val.strip():
            raise ConfigError(f"invalid config: {name}: {item!r} is not NAME=VALUE")
        out.append((key.strip(), val.strip()))
    if len({k for k, _ in out}) != len(out):
        raise ConfigError(f"invalid config: {name}: duplicate name")
    return tuple(out)


def _coerce(name: str, kind: Any, raw: Any) -> Any:
    if name == "workers":
        return parse_workers(raw)
    if name in ("tokenizers", "kv_events", "lora_adapters"):
        return parse_pairs(name, raw)
    try:
        if kind in (bool, "bool"):
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(raw)
        if kind in (int, "int"):
            return int(raw)
        if kind in (float, "float"):
            return float(raw)
        return str(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"invalid config: {name}: cannot read {raw!r} as "
                          f"{getattr(kind, '__name__', kind)}") from None


def _validate(config: RouterConfig) -> RouterConfig:
    for f in fields(config):
        check = f.metadata.get("check")
        value = getattr(config, f.name)
        if check is not None and not check(value):
            raise ConfigError(f"invalid config: {f.name}: {f.metadata['rule']} (got {value!r})")
    return config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML file with any of the settings below")
    for f in fields(RouterConfig):
        flag = "--" + f.name.replace("_", "-")
        parser.add_argument(flag, dest=f.name, default=None,
                            help=f"{f.metadata['help']} [env {ENV_PREFIX}{f.name.upper()}]")


def load_config(args: Mapping[str, Any], env: Mapping[str, str] | None = None) -> RouterConfig:
    """Merge defaults < YAML < env < flags, coerce, validate."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    path = args.get("config") or env.get(ENV_PREFIX + "CONFIG")
    known = {f.name: f for f in fields(RouterConfig)}
    if path:
        try:
            with open(path) as fh:
                loaded = yaml.safe_load(fh) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"invalid config: config: cannot read {path}: {exc}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"invalid config: config: {path} must hold a mapping")
        for key, raw in loaded.items():
            name = str(key).replace("-", "_")
            if name not in known:
                raise ConfigError(f"invalid config: {key}: unknown setting in {path}")
            values[name] = raw
    for name in known:
        if (raw := env.get(ENV_PREFIX + name.upper())) is not None:
            values[name] = raw
        if (raw := args.get(name)) is not None:
            values[name] = raw
    coerced = {name: _coerce(name, known[name].type, raw) for name, raw in values.items()}
    for name, f in known.items():
        if name not in coerced and f.default is MISSING:
            raise ConfigError(f"invalid config: {name}: required")
    return _validate(RouterConfig(**coerced))
