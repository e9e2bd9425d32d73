"""The README's sidecar example, executed: same env vars, same command.

The test reads the example from the doc (the ```bash block starting with `# sidecar-example`
and the ```yaml block starting with `# sidecar-pod`) so the two cannot drift apart. Only the
worker URLs and the port are replaced, because the test's fleet and free port differ from
the doc's; everything else is taken as written.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import yaml
from openai import OpenAI

from router.client import openai_headers
from tests.client.conftest import SIM_MODEL
from tests.support import REPO, free_port, stop, wait_http

DOC = REPO / "README.md"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def doc_block(lang: str, marker: str) -> str:
    for found_lang, body in FENCE.findall(DOC.read_text()):
        if found_lang == lang and body.lstrip().startswith(marker):
            return body
    raise AssertionError(f"{DOC} has no ```{lang} block starting with {marker!r}")


@dataclass
class SidecarExample:
    env: dict[str, str]  # every `export NAME=VALUE`, in order
    command: list[str]   # the one command line, without a trailing `&`


def sidecar_example() -> SidecarExample:
    env: dict[str, str] = {}
    commands: list[list[str]] = []
    for line in doc_block("bash", "# sidecar-example").splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        if words[0] == "export":
            name, _, value = words[1].partition("=")
            env[name] = value
        else:
            commands.append([w for w in words if w != "&"])
    assert len(commands) == 1, commands
    return SidecarExample(env=env, command=commands[0])


def test_example_is_env_only_and_consistent() -> None:
    example = sidecar_example()
    assert example.command == ["prefix-router", "serve"]  # no flags: env vars only
    assert {"PREFIX_ROUTER_WORKERS", "PREFIX_ROUTER_HOST", "PREFIX_ROUTER_PORT"} <= set(
        example.env)
    assert example.env["PREFIX_ROUTER_HOST"] == "127.0.0.1"  # only the app can reach it
    host, port = example.env["PREFIX_ROUTER_HOST"], example.env["PREFIX_ROUTER_PORT"]
    assert example.env["OPENAI_BASE_URL"] == f"http://{host}:{port}/v1"


def test_pod_snippet_matches_the_example() -> None:
    example = sidecar_example()
    pod = yaml.safe_load(doc_block("yaml", "# sidecar-pod"))
    containers = pod["spec"].get("initContainers", []) + pod["spec"]["containers"]
    by_name = {c["name"]: c for c in containers}
    router, app = by_name["prefix-router"], by_name["app"]
    assert router["command"] == example.command
    router_env = {e["name"]: str(e["value"]) for e in router["env"]}
    assert router_env == {k: v for k, v in example.env.items() if k.startswith("PREFIX_ROUTER_")}
    app_env = {e["name"]: str(e["value"]) for e in app["env"]}
    assert app_env["OPENAI_BASE_URL"] == example.env["OPENAI_BASE_URL"]


def test_sidecar_example_routes_a_request(sim_workers: list[str]) -> None:
    example = sidecar_example()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFIX_ROUTER_")}
    env.update(example.env)
    env["PREFIX_ROUTER_WORKERS"] = ",".join(sim_workers)
    env["PREFIX_ROUTER_PORT"] = str(port)
    env["PYTHONUNBUFFERED"] = "1"
    # The console script installed next to this interpreter, as `prefix-router` on PATH.
    executable = Path(sys.executable).parent / example.command[0]
    proc = subprocess.Popen([str(executable), *example.command[1:]], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    host = example.env["PREFIX_ROUTER_HOST"]
    base_url = example.env["OPENAI_BASE_URL"].replace(
        f":{example.env['PREFIX_ROUTER_PORT']}/", f":{port}/")
    try:
        wait_http(f"http://{host}:{port}/ready", timeout=60, proc=proc)
        context = f"Sidecar document {uuid.uuid4()}. " * 20
        client = OpenAI(base_url=base_url, api_key="unused", max_retries=0)
        raw = client.chat.completions.with_raw_response.create(
            model=SIM_MODEL, messages=[{"role": "user", "content": context + "\n\nQ?"}],
            max_tokens=8, extra_headers=openai_headers(context))
        client.close()
        assert raw.parse().choices[0].message.content
        assert raw.headers["x-prefix-router-worker"] in {"w0", "w1", "w2"}
        assert raw.headers["x-prefix-router-reason"]
    finally:
        stop(proc)
