"""prefix-worker: config layering, the vLLM command for each profile, and the run lifecycle.

The lifecycle tests run the real launcher against a fake `vllm.entrypoints.openai.api_server`
(tests/engine/fake_vllm, put on the child's PYTHONPATH) and a private redis-server.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from engine_worker.cli import parse
from engine_worker.command import build
from engine_worker.config import WorkerConfig
from router.protocol import vllm_metrics
from tests.support import REPO, free_port, stop

PROFILES = sorted((REPO / "lmcache_config").glob("*.yaml"))
FAKE_VLLM = REPO / "tests" / "engine" / "fake_vllm"


def dry_run(*args: str, env: dict[str, str] | None = None) -> tuple[dict[str, str], list[str]]:
    """Run `python -m engine_worker ... --dry-run`; (exported env, vLLM argv)."""
    proc = subprocess.run(
        [sys.executable, "-m", "engine_worker", "--dry-run", *args], cwd=REPO,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("PREFIX_WORKER_")},
             **(env or {})},
        capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    exported: dict[str, str] = {}
    argv: list[str] = []
    for line in proc.stdout.splitlines():
        if line.startswith("export "):
            key, _, value = line[len("export "):].partition("=")
            exported[key] = shlex.split(value)[0] if value else ""
        elif line and not line.startswith("#"):
            argv = shlex.split(line)
    return exported, argv


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.stem)
def test_dry_run_for_each_lmcache_profile(profile: Path) -> None:
    env, argv = dry_run("--model", "/models/llama-3-8b", "--served-model-name", "llama",
                        "--lmcache-profile", str(profile.relative_to(REPO)),
                        "--kv-events-endpoint", "tcp://*:5557", "--port", "8100")
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert flag(argv, "--model") == "/models/llama-3-8b"
    assert flag(argv, "--served-model-name") == "llama"
    assert flag(argv, "--port") == "8100"
    assert flag(argv, "--block-size") == "16"
    assert flag(argv, "--gpu-memory-utilization") == "0.9"
    assert "--enable-prefix-caching" in argv and "--enable-prompt-tokens-details" in argv
    assert flag(argv, "--prefix-caching-hash-algo") == "sha256_cbor"
    assert json.loads(flag(argv, "--kv-transfer-config")) == {
        "kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
    assert json.loads(flag(argv, "--kv-events-config")) == {
        "enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:5557",
        "topic": "kv-events"}
    assert env["LMCACHE_CONFIG_FILE"] == str(profile.resolve())
    assert env["LMCACHE_TRACK_USAGE"] == "false"
    assert env["PYTHONHASHSEED"] == "0"
    assert "VLLM_CPU_KVCACHE_SPACE" not in env


def test_dry_run_cpu_device() -> None:
    env, argv = dry_run("--model", "/m", "--device", "cpu", "--cpu-kvcache-space-gib", "2",
                        "--python", "/opt/vllm/bin/python", "--max-model-len", "4096",
                        "--max-num-seqs", "8", "--", "--dtype", "float32")
    assert argv[:3] == ["/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert flag(argv, "--block-size") == "32"
    assert "--gpu-memory-utilization" not in argv and "--kv-transfer-config" not in argv
    assert flag(argv, "--max-model-len") == "4096" and flag(argv, "--max-num-seqs") == "8"
    assert argv[-2:] == ["--dtype", "float32"]
    assert env == {"PYTHONHASHSEED": "0", "VLLM_CPU_KVCACHE_SPACE": "2",
                   "PYTHONPATH": str(REPO / "engine_worker" / "vllm_cpu_site")}


def test_a_python_path_of_the_users_follows_the_cpu_site() -> None:
    env = build(WorkerConfig(model="/m", device="cpu", env={"PYTHONPATH": "/plugins"})).env
    assert env["PYTHONPATH"].split(os.pathsep) == [
        str(REPO / "engine_worker" / "vllm_cpu_site"), "/plugins"]


@pytest.mark.skipif(platform.machine() != "x86_64" or sys.platform != "linux",
                    reason="AMX and arch_prctl's syscall number are x86-64 Linux's")
def test_a_cpu_workers_python_may_use_amx_where_the_cpu_has_it() -> None:
    """vLLM's CPU kernels use AMX without asking Linux; the worker's environment asks first.

    ARCH_GET_XCOMP_PERM (0x1022) returns the features this process may use; AMX's tile data
    is bit 18. Without the request a fresh process has it clear even on an AMX CPU.
    """
    env = build(WorkerConfig(model="/m", device="cpu")).env
    probe = ("import ctypes; mask = ctypes.c_uint64(); "
             "ctypes.CDLL(None).syscall(158, 0x1022, ctypes.byref(mask)); "
             "print(mask.value >> 18 & 1)")
    permitted = subprocess.run([sys.executable, "-c", probe], env={**os.environ, **env},
                               capture_output=True, text=True, timeout=60, check=True)
    bare = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, check=True)
    has_amx = "amx_tile" in Path("/proc/cpuinfo").read_text().split()
    assert permitted.stdout.strip() == ("1" if has_amx else "0")
    assert bare.stdout.strip() == "0"


def test_yaml_then_env_then_flags(tmp_path: Path) -> None:
    config_file = tmp_path / "worker.yaml"
    config_file.write_text("model: /from/yaml\nport: 9000\nblock-size: 32\n"
                           "max_num_seqs: 4\nenv: {LMCACHE_P2P_HOST: 10.0.0.5}\n")
    environ = {"PREFIX_WORKER_PORT": "9100", "PREFIX_WORKER_ENABLE_PROMPT_TOKENS_DETAILS": "no",
               "PREFIX_WORKER_CONFIG": str(config_file)}
    old = dict(os.environ)
    try:
        os.environ.update(environ)
        cfg, _ = parse(["--max-num-seqs", "16", "--env", "A=1"])
    finally:
        os.environ.clear()
        os.environ.update(old)
    assert cfg.model == "/from/yaml" and cfg.block_size == 32
    assert cfg.port == 9100 and cfg.max_num_seqs == 16
    assert cfg.enable_prompt_tokens_details is False
    assert cfg.env == {"A": "1"}  # flags replace, not merge, a mapping
    assert "--enable-prompt-tokens-details" not in build(cfg).argv


@pytest.mark.parametrize(("args", "message"), [
    (["--model", "m", "--lmcache-profile", "nope.yaml"], "lmcache_profile not found"),
    (["--model", "m", "--block-size", "0"], "block_size"),
    (["--model", "m", "--device", "cpu", "--block-size", "16"], "multiple of 32"),
    (["--port", "80"], "model is required"),
    (["--model", "m", "--kv-events-endpoint", "localhost:5557"], "ZMQ endpoint"),
])
def test_bad_settings_exit_2(args: list[str], message: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "engine_worker", *args, "--dry-run"], cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and message in proc.stderr


def test_advertised_endpoints() -> None:
    cfg = WorkerConfig(model="m", host="0.0.0.0", port=8001, advertise_url="http://w1:8001/",
                       kv_events_endpoint="tcp://*:5557").validate()
    assert cfg.local_url == "http://127.0.0.1:8001"
    assert cfg.public_url == "http://w1:8001"
    assert cfg.public_kv_events_endpoint == "tcp://w1:5557"
    assert cfg.models == ("m",)


def test_record_names_vllms_api_key_by_fingerprint_only(monkeypatch) -> None:
    """vLLM's --api-key (after --) or VLLM_API_KEY: the registry gets its fingerprint, for
    routers to pick the key from their own file; never the key."""
    from engine_worker.launcher import Launcher
    from router.protocol import registry

    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    stats = vllm_metrics.EngineStats(None, None, 0, 0)
    for cfg in (WorkerConfig(model="m", extra_args=("--api-key", "sk-1")),
                WorkerConfig(model="m", extra_args=("--api-key=sk-1",)),
                WorkerConfig(model="m", env={"VLLM_API_KEY": "sk-1"})):
        record = Launcher(cfg, check_vllm=False).record(stats)
        assert record.extra[registry.API_KEY_FINGERPRINT] == registry.key_fingerprint("sk-1")
        assert "sk-1" not in str(record.to_hash())
    plain = Launcher(WorkerConfig(model="m"), check_vllm=False).record(stats)
    assert registry.API_KEY_FINGERPRINT not in plain.extra


def test_metrics_parse_sums_engines() -> None:
    text = (
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="32",engine="0",num_gpu_blocks="100"} 1.0\n'
        'vllm:cache_config_info{block_size="32",engine="1",num_gpu_blocks="50"} 1.0\n'
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0"} 2.0\nvllm:num_requests_running{engine="1"} 1.0\n'
        "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine=\"0\"} 4.0\n")
    stats = vllm_metrics.parse(text)
    assert stats.capacity_blocks == 150 and stats.block_size == 32
    assert stats.in_flight == 7


def spawn_worker(port: int, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "engine_worker", "--model", "fake", "--served-model-name", "fm",
         "--host", "127.0.0.1", "--port", str(port), "--python", sys.executable,
         "--env", f"PYTHONPATH={FAKE_VLLM}", "--health-timeout-s", "30",
         "--drain-grace-s", "0.5", "--log-level", "DEBUG",
         "--skip-vllm-check",  # the fake has no KV-event or block-hash interfaces
         *args],
        cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for(check, within_s: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < deadline, f"{what} not reached in {within_s}s"
        time.sleep(0.05)


def test_register_drain_deregister(redis_server, tmp_path: Path) -> None:
    port = free_port()
    record = tmp_path / "fake.json"
    proc = spawn_worker(port, "--register-redis", redis_server.url, "--worker-id", "wA",
                        "--kv-events-endpoint", "tcp://*:5599",
                        "--kv-events-replay-endpoint", "tcp://*:5598",
                        "--lmcache-profile", "lmcache_config/cpu-offload.yaml",
                        env={"FAKE_VLLM_RECORD": str(record)})
    client = redis_server.client()
    key = "prefix-router:{workers}:wA"
    try:
        wait_for(lambda: client.exists(key) == 1, what="registration")
        entry = {k.decode(): v.decode() for k, v in client.hgetall(key).items()}
        assert entry["url"] == f"http://127.0.0.1:{port}"
        assert json.loads(entry["models"]) == ["fm"]
        assert entry["capacity_blocks"] == "1234" and entry["block_size"] == "16"
        assert entry["kv_events_endpoint"] == "tcp://127.0.0.1:5599"
        assert entry["draining"] == "0"
        extra = json.loads(entry["extra"])
        assert extra["kv_events_replay_endpoint"] == "tcp://127.0.0.1:5598"
        assert extra["hash_algo"] == "sha256_cbor" and extra["hash_seed"] == "0"
        seen = json.loads(record.read_text())
        assert seen["env"]["LMCACHE_CONFIG_FILE"].endswith("lmcache_config/cpu-offload.yaml")
        assert seen["env"]["PYTHONHASHSEED"] == "0"

        result: dict[str, str] = {}

        def slow() -> None:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/slow?s=2", timeout=10) as r:
                result["body"] = r.read().decode()

        thread = threading.Thread(target=slow)
        thread.start()
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        wait_for(lambda: client.hget(key, "draining") == b"1", what="draining flag")
        assert proc.poll() is None, "launcher must wait for the in-flight request"
        thread.join(10)
        assert result.get("body") == "done"
        assert proc.wait(timeout=20) == 0
        assert client.exists(key) == 0
        assert client.zscore("prefix-router:{workers}", "wA") is None
    finally:
        stop(proc)
        out = proc.stdout.read() if proc.stdout else ""
        print(out)


def test_exits_with_vllm_status() -> None:
    proc = spawn_worker(free_port(), env={"FAKE_VLLM_EXIT": "3"})
    try:
        assert proc.wait(timeout=30) == 3
    finally:
        stop(proc)


def test_registers_once_redis_is_reachable(redis_server) -> None:
    """Redis down at start: the worker serves anyway and registers when Redis is back."""
    port = free_port()
    redis_server.kill()
    proc = spawn_worker(port, "--register-redis", redis_server.url, "--worker-id", "wB")
    try:
        wait_for(lambda: _health(port), what="worker health")
        redis_server.start()
        client = redis_server.client()
        wait_for(lambda: client.exists("prefix-router:{workers}:wB") == 1, within_s=30,
                 what="late registration")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        stop(proc)


def _health(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as resp:
            return resp.status == 200
    except OSError:
        return False


@pytest.fixture
def mirroring_worker(redis_server):  # type: ignore[no-untyped-def]
    """A launcher (fake vLLM) registered in Redis, with KV events on two free ports."""
    port, events, replay = free_port(), free_port(), free_port()
    proc = spawn_worker(port, "--register-redis", redis_server.url, "--worker-id", "wE",
                        "--kv-events-endpoint", f"tcp://*:{events}",
                        "--kv-events-replay-endpoint", f"tcp://*:{replay}")
    try:
        yield events, replay
    finally:
        stop(proc)


async def test_launcher_mirrors_kv_events_into_redis(redis_server, mirroring_worker) -> None:  # type: ignore[no-untyped-def]
    """The optional Redis path: {prefix}exact:{worker} follows the engine's KV events."""
    from tests.engine.vllm_publisher import FakePublisher, cleared, removed, stored

    events, replay = mirroring_worker
    client = redis_server.client()
    key = "prefix-router:exact:{wE}"

    def members() -> set[int]:
        return {int(m) for m in client.smembers(key)}

    async def until(check, what: str) -> None:
        deadline = time.monotonic() + 30
        while not check():
            assert time.monotonic() < deadline, f"{what} not reached"
            await asyncio.sleep(0.1)
            await pub.publish([])  # PUB drops what the SUB missed; a gap makes it replay

    # The fake engine doesn't publish: this stands in for vLLM's sockets on the same ports.
    async with FakePublisher(f"tcp://127.0.0.1:{events}", f"tcp://127.0.0.1:{replay}",
                             topic="kv-events") as pub:
        await pub.publish([stored([11, 12, 13])])
        await until(lambda: members() == {11, 12, 13}, "stored blocks in redis")
        assert 0 < client.pttl(key) <= 3600 * 1000
        await pub.publish([removed([12])])
        await until(lambda: members() == {11, 13}, "removal")
        await pub.publish([cleared()])
        await until(lambda: client.exists(key) == 0, "clear")
