"""The chart renders offline with its defaults and every example, lints clean, and every
object is valid Kubernetes (strict schema, 1.30)."""

from __future__ import annotations

import pytest

from tests.deploy import chart as c

EXAMPLE_FILES = sorted(p.name for p in c.EXAMPLES.glob("*.yaml"))
CASES = [("defaults", None)] + [(name, name) for name in EXAMPLE_FILES]


def _values(example: str | None):
    return c.example_values(example) if example else {}


def test_required_examples_exist():
    assert {"single-gpu-node.yaml", "multi-node.yaml", "sidecar.yaml"} <= set(EXAMPLE_FILES)


def test_chart_has_schema_and_no_dependencies():
    assert c.chart().schema is not None
    assert not c.chart().metadata.get("dependencies")
    assert not (c.CHART / "charts").exists()


@pytest.mark.parametrize(("label", "example"), CASES, ids=[label for label, _ in CASES])
def test_renders_valid_kubernetes_objects(label, example):
    objs = c.objects(_values(example))
    assert objs, "nothing rendered"
    seen = set()
    for obj in objs:
        key = (obj["kind"], obj["metadata"]["name"])
        assert key not in seen, f"duplicate {key}"
        seen.add(key)
        c.validate(obj)


@pytest.mark.parametrize(("label", "example"), CASES, ids=[label for label, _ in CASES])
def test_lints_clean(label, example):
    report = c.lint(_values(example))
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not report["errors"] and not problems, report


def test_validation_catches_a_broken_object():
    """Guard against a validator that passes everything."""
    bad = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"},
           "spec": {"replicas": "two", "selector": {}, "template": {}, "bogus": 1}}
    with pytest.raises(Exception):  # noqa: B017 - any validation error will do
        c.validate(bad)
