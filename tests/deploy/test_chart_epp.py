"""The chart's epp mode: picker Deployment/Service/RBAC, an InferencePool valid against the
Gateway API Inference Extension's published CRD (tests/deploy/crds), an HTTPRoute to it,
and the wiring between them and the worker pods."""

from __future__ import annotations

import copy
from dataclasses import fields

import helm_python as helm
import pytest

from router.config import ENV_PREFIX, RouterConfig
from tests.deploy import chart as c

VALUES = c.example_values("epp.yaml")


@pytest.fixture(scope="module")
def objs() -> list[dict]:
    return c.objects(VALUES)


def picker_container(objs: list[dict]) -> dict:
    deployment = c.one(objs, "Deployment", f"{c.RELEASE}-prefix-router-epp")
    return next(x for x in c.containers(deployment) if x["name"] == "epp")


def test_pool_selects_the_worker_pods_on_their_serving_port(objs) -> None:
    pool = c.one(objs, "InferencePool")
    worker = c.one(objs, "StatefulSet")
    pod_labels = worker["spec"]["template"]["metadata"]["labels"]
    assert pool["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    engine = next(x for x in c.containers(worker) if any(
        p.get("name") == "http" for p in x.get("ports", [])))
    http = next(p for p in engine["ports"] if p["name"] == "http")
    assert pool["spec"]["targetPorts"] == [{"number": http["containerPort"]}]


def test_pool_names_the_picker_service_and_its_grpc_port(objs) -> None:
    pool = c.one(objs, "InferencePool")
    ref = pool["spec"]["endpointPickerRef"]
    service = c.one(objs, "Service", ref["name"])
    grpc = next(p for p in service["spec"]["ports"] if p["name"] == "grpc")
    assert ref["port"]["number"] == grpc["port"] and ref["failureMode"] == "FailClose"
    deployment = c.one(objs, "Deployment", ref["name"])
    assert service["spec"]["selector"].items() <= \
        deployment["spec"]["template"]["metadata"]["labels"].items()
    container = picker_container(objs)
    assert container["command"] == ["prefix-router", "epp"]
    assert {"name": "grpc", "containerPort": grpc["port"], "protocol": "TCP"} in \
        container["ports"]
    env = c.env(container)
    assert env["PREFIX_ROUTER_EPP_PORT"] == str(grpc["port"])
    assert env["PREFIX_ROUTER_INFERENCE_POOL"] == pool["metadata"]["name"]
    assert env["PREFIX_ROUTER_KUBE_NAMESPACE"] == c.NAMESPACE
    assert env["PREFIX_ROUTER_EPP_FAIL_OPEN"] == "false"
    assert "PREFIX_ROUTER_WORKERS" not in env  # pods by IP, as the gateway names them


def test_every_picker_setting_is_a_router_setting(objs) -> None:
    known = {ENV_PREFIX + f.name.upper() for f in fields(RouterConfig)}
    env = c.env(picker_container(objs))
    assert {k for k in env if k.startswith(ENV_PREFIX)} <= known


def test_picker_may_read_its_pool_and_pods_only(objs) -> None:
    role = c.one(objs, "Role")
    rules = {(r["apiGroups"][0], r["resources"][0]): set(r["verbs"]) for r in role["rules"]}
    assert rules == {("inference.networking.k8s.io", "inferencepools"): {"get"},
                     ("", "pods"): {"list"}}
    binding = c.one(objs, "RoleBinding")
    deployment = c.one(objs, "Deployment", f"{c.RELEASE}-prefix-router-epp")
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account,
                                    "namespace": c.NAMESPACE}]
    assert c.one(objs, "ServiceAccount", account)


def test_route_sends_the_gateway_to_the_pool(objs) -> None:
    route = c.one(objs, "HTTPRoute")
    pool = c.one(objs, "InferencePool")
    assert route["spec"]["parentRefs"] == [{"name": "inference-gateway"}]
    (rule,) = route["spec"]["rules"]
    assert rule["backendRefs"] == [{"group": "inference.networking.k8s.io",
                                    "kind": "InferencePool",
                                    "name": pool["metadata"]["name"]}]


def test_fail_open_reaches_the_pool_and_the_picker() -> None:
    values = copy.deepcopy(VALUES)
    values["epp"]["failureMode"] = "FailOpen"
    objs = c.objects(values)
    assert c.one(objs, "InferencePool")["spec"]["endpointPickerRef"]["failureMode"] == \
        "FailOpen"
    assert c.env(picker_container(objs))["PREFIX_ROUTER_EPP_FAIL_OPEN"] == "true"


def test_epp_mode_is_off_by_default() -> None:
    assert not c.find(c.objects(), "InferencePool")
    assert not c.find(c.objects(), "HTTPRoute")


def test_pool_schema_check_catches_a_broken_pool(objs) -> None:
    """Guard: the shipped CRD schema really constrains the pool."""
    pool = copy.deepcopy(c.one(objs, "InferencePool"))
    pool["spec"]["targetPorts"] = [{"number": 8000}] * 9  # at most 8
    with pytest.raises(Exception):  # noqa: B017 - any validation error will do
        c.validate(pool)


@pytest.mark.parametrize("values", [{"epp": {"failureMode": "FailSometimes"}},
                                    {"epp": {"gateway": {"name": ""}}},
                                    {"epp": {"grpcPort": 0}}],
                         ids=["failure mode typo", "gateway without name", "port zero"])
def test_schema_rejects_bad_epp_values(values) -> None:
    with pytest.raises(helm.HelmValuesError):
        c.render(values)
