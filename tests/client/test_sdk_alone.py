"""The SDK installs alone with only aiohttp and talks to a real router; the server wheel no
longer ships ``bench``; both wheels can share one environment.

Wheels are built with pip from the repository (sdk/pyproject.toml, ../pyproject.toml) and
installed into a fresh venv; aiohttp comes from the configured package index.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
import zipfile
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.client.conftest import SIM_MODEL, Fleet
from tests.support import REPO

SERVER_ONLY = {"redis", "uhashring", "prometheus-client", "uvloop", "pyyaml", "orjson"}


def _run(args: Sequence[str | Path], cwd: Path | None = None,
         env: dict[str, str] | None = None) -> str:
    proc = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, f"{args} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def _clean_env() -> dict[str, str]:
    """No PYTHONPATH: the fresh venv must not see this checkout."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.fixture(scope="module")
def sdk_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sdk-dist")
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", out, REPO / "sdk"])
    (wheel,) = out.glob("prefix_router_client-*.whl")
    return wheel


@pytest.fixture(scope="module")
def server_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built from a copy of what `pip install .` reads (as the Docker context is), bench/
    included, so no build/ or egg-info is left in the checkout."""
    src = tmp_path_factory.mktemp("server-src")
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "results")
    for folder in ("router", "engine_worker", "bench"):
        shutil.copytree(REPO / folder, src / folder, ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    out = tmp_path_factory.mktemp("server-dist")
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", out, src])
    (wheel,) = out.glob("prefix_router-*.whl")
    return wheel


@pytest.fixture(scope="module")
def sdk_python(tmp_path_factory: pytest.TempPathFactory, sdk_wheel: Path) -> Path:
    """A fresh venv holding the SDK wheel and what it pulls in."""
    venv = tmp_path_factory.mktemp("sdk-venv")
    _run([sys.executable, "-m", "venv", venv])
    python = venv / "bin" / "python"
    _run([python, "-m", "pip", "install", "-q", sdk_wheel], env=_clean_env())
    return python


def test_sdk_wheel_holds_only_the_client(sdk_wheel: Path) -> None:
    with zipfile.ZipFile(sdk_wheel) as whl:
        names = whl.namelist()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        requires = [line.split(":", 1)[1].strip() for line in
                    whl.read(metadata).decode().splitlines() if line.startswith("Requires-Dist:")]
    code = [n for n in names if ".dist-info/" not in n]
    assert code and all(n.startswith("router/client/") for n in code), code
    assert "router/client/contract.py" in code
    assert "router/__init__.py" not in names  # a namespace portion: never shadows the server
    assert [_norm(r.split(">")[0].split(";")[0]) for r in requires] == ["aiohttp"]
    versions = {tomllib.loads((REPO / p).read_text())["project"]["version"]
                for p in ("pyproject.toml", "sdk/pyproject.toml")}
    assert len(versions) == 1, versions


def test_sdk_venv_has_no_server_dependencies(sdk_python: Path) -> None:
    listed = json.loads(_run([sdk_python, "-m", "pip", "list", "--format=json"],
                             env=_clean_env()))
    installed = {_norm(p["name"]) for p in listed}
    assert {"prefix-router-client", "aiohttp"} <= installed
    assert not installed & SERVER_ONLY, installed & SERVER_ONLY
    assert "prefix-router" not in installed


SDK_SCRIPT = textwrap.dedent("""
    import importlib.util, json, sys
    import router.client
    from router.client import ContextClient, context_hash
    from router.client.contract import CONTEXT_HASH_HEADER, is_valid_context_hash

    url, model = sys.argv[1], sys.argv[2]
    assert "site-packages" in router.client.__file__, router.client.__file__
    absent = [m for m in ("router.server", "router.routing", "redis", "prometheus_client",
                          "uhashring", "yaml", "uvloop") if importlib.util.find_spec(m)]
    docs = [f"Document {i} on installing the SDK alone. " * 30 for i in range(3)]
    with ContextClient(url) as sdk:
        first = sdk.chat(docs, "What does it need?", model=model, max_tokens=8)
        second = sdk.chat(docs, "Anything else?", model=model, max_tokens=8)
        with sdk.chat(docs, "Stream it.", model=model, stream=True, max_tokens=8) as stream:
            streamed = "".join(stream)
        models = sdk.models()
    print(json.dumps({"absent": absent, "workers": [first.worker, second.worker, stream.worker],
                      "reason": second.reason, "texts": [first.text, streamed],
                      "models": models, "header": CONTEXT_HASH_HEADER,
                      "key_ok": is_valid_context_hash(context_hash("x"))}))
""")


def test_sdk_alone_talks_to_a_real_router(sdk_python: Path, fleet: Fleet,
                                          tmp_path: Path) -> None:
    script = tmp_path / "use_sdk.py"
    script.write_text(SDK_SCRIPT)
    out = _run([sdk_python, script, fleet.router_url, SIM_MODEL], cwd=tmp_path,
               env=_clean_env())
    got = json.loads(out.strip().splitlines()[-1])
    assert got["absent"] == []  # no server code, no server dependency importable
    assert len(set(got["workers"])) == 1 and got["workers"][0] in {"w0", "w1", "w2"}, got
    assert got["reason"] == "warm"  # the context is resident after the first request
    assert all(got["texts"]) and got["models"] == [SIM_MODEL]
    assert got["header"] == "X-Context-Hash" and got["key_ok"]


def test_server_wheel_does_not_ship_bench(server_wheel: Path) -> None:
    with zipfile.ZipFile(server_wheel) as whl:
        names = whl.namelist()
        (top_level,) = [n for n in names if n.endswith(".dist-info/top_level.txt")] or [None]
        tops = set(whl.read(top_level).decode().split()) if top_level else set()
    packages = {n.split("/", 1)[0] for n in names if ".dist-info/" not in n}
    assert packages == {"router", "engine_worker"}, packages
    assert not tops - {"router", "engine_worker"}, tops
    assert "router/client/contract.py" in names and "router/server/app.py" in names


def test_server_and_sdk_share_an_environment(sdk_python: Path, sdk_wheel: Path,
                                             server_wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "both"
    _run([sdk_python, "-m", "pip", "install", "-q", "--no-deps", "--target", target,
          sdk_wheel, server_wheel], env=_clean_env())
    env = {**_clean_env(), "PYTHONPATH": str(target)}
    out = _run([sdk_python, "-c", "import router, router.client.contract as c; "
                "print(router.__file__); print(c.__file__)"], cwd=tmp_path, env=env)
    package, contract = out.split()
    assert package == str(target / "router" / "__init__.py")  # the server's regular package
    assert contract == str(target / "router" / "client" / "contract.py")
