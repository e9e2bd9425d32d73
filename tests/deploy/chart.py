"""Offline Helm rendering and Kubernetes schema validation for the deploy/ tests.

Rendering uses helm-python-sdk (Helm's Go SDK through a bundled C library: no helm
binary, no cluster, no network); validation uses kubernetes-validate's bundled
Kubernetes JSON schemas in strict mode (unknown fields are errors).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import kubernetes_validate.utils
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
CHART = DEPLOY / "helm" / "prefix-router"
EXAMPLES = CHART / "examples"
KUBE_VERSION = "1.30.0"  # oldest supported (Chart.yaml kubeVersion)
# Also validate against the newest schemas shipped, to catch removed or changed APIs.
VALIDATE_VERSIONS = (KUBE_VERSION, kubernetes_validate.utils.latest_version())
RELEASE = "rag"
NAMESPACE = "llm"

# Kinds from CRDs, which kubernetes-validate has no schema for (checked structurally).
CRD_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor"),
             ("gateway.networking.k8s.io/v1", "HTTPRoute")}
# CRDs whose published schema ships in tests/deploy/crds: validated against it.
CRD_FILES = {("inference.networking.k8s.io/v1", "InferencePool"):
             Path(__file__).parent / "crds" / "inferencepools.inference.networking.k8s.io.yaml"}


@cache
def chart() -> helm.Chart:
    return helm.Chart.load(CHART)


def example_values(name: str) -> dict[str, Any]:
    return yaml.safe_load((EXAMPLES / name).read_text()) or {}


def render(values: dict[str, Any] | None = None) -> dict[str, str]:
    """Template path -> rendered text, exactly as `helm template` would produce."""
    return chart().render(values=values or {}, name=RELEASE, namespace=NAMESPACE,
                          is_install=True)


def objects(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every Kubernetes object the chart renders (NOTES.txt excluded)."""
    out = []
    for path, text in sorted(render(values).items()):
        if path.endswith("NOTES.txt"):
            continue
        out.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return out


def find(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind
            and (name is None or o["metadata"]["name"] == name)]


def one(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = find(objs, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def validate(obj: dict[str, Any]) -> None:
    """Raise if obj is not a valid object of its kind (strict: unknown fields are errors)."""
    if (obj["apiVersion"], obj["kind"]) in CRD_FILES:
        validate_crd(obj)
        return
    if (obj["apiVersion"], obj["kind"]) in CRD_KINDS:
        assert obj["metadata"]["name"] and isinstance(obj["spec"], dict)
        return
    for version in VALIDATE_VERSIONS:
        kubernetes_validate.validate(obj, version, strict=True)


@cache
def crd_schema(api_version: str, kind: str) -> dict[str, Any]:
    """The openAPIV3Schema of the served version, closed against unknown fields as the API
    server prunes and strict clients reject them."""
    crd = yaml.safe_load(CRD_FILES[(api_version, kind)].read_text())
    version = api_version.split("/")[1]
    schema = next(v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"]
                  if v["name"] == version)
    return _closed(schema)


def _closed(schema: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in schema.items() if not k.startswith("x-kubernetes")}
    if "properties" in out:
        out["properties"] = {k: _closed(v) for k, v in out["properties"].items()}
        out.setdefault("additionalProperties", False)
    if isinstance(out.get("items"), dict):
        out["items"] = _closed(out["items"])
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = _closed(out["additionalProperties"])
    return out


def validate_crd(obj: dict[str, Any]) -> None:
    schema = crd_schema(obj["apiVersion"], obj["kind"])
    # metadata is the API server's ObjectMeta, not the CRD's to describe
    jsonschema.validate({k: v for k, v in obj.items() if k != "metadata"},
                        {**schema, "properties": {k: v for k, v in schema["properties"].items()
                                                  if k != "metadata"}})
    assert obj["metadata"]["name"]


def lint(values: dict[str, Any] | None = None) -> dict[str, Any]:
    return helm.lint(CHART, values=values or {}, strict=True, namespace=NAMESPACE,
                     kube_version="v" + KUBE_VERSION)


def containers(pod_owner: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod_owner["spec"]["template"]["spec"]
    return spec.get("initContainers", []) + spec["containers"]


def env(container: dict[str, Any]) -> dict[str, Any]:
    """name -> value (or the valueFrom mapping)."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}
