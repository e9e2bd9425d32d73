"""values.schema.json rejects values that would render a broken or inconsistent fleet."""

from __future__ import annotations

import helm_python as helm
import pytest

from tests.deploy import chart as c

INVALID = {
    "unknown policy": {"router": {"policy": "random"}},
    "misspelt key": {"routr": {"replicas": 2}},
    "unknown router key": {"router": {"replica": 2}},
    "zero router replicas": {"router": {"replicas": 0}},
    "epsilon not positive": {"router": {"boundEpsilon": 0}},
    "upper-case log level": {"router": {"logLevel": "INFO"}},
    "worker URL not http": {"router": {"workers": ["tcp://10.0.0.1:8000"]}},
    "gpu utilisation over 1": {"workerDefaults": {"gpuMemoryUtilization": 1.5}},
    "gpu utilisation as string": {"workerDefaults": {"gpuMemoryUtilization": "0.9"}},
    "odd block size": {"workerDefaults": {"blockSize": 7}},
    "unknown LMCache profile": {"workerDefaults": {"lmcache": {"profile": "tape"}}},
    "model without weights": {"workers": {"models": [{"name": "llama"}]}},
    "model name not a DNS label": {"workers": {"models": [{"name": "Llama_3", "model": "x"}]}},
    "negative GPUs": {"workers": {"models": [{"name": "a", "model": "x", "gpus": -1}]}},
    "hash seed not a number": {"pythonHashSeed": "random"},
    "external Redis URL not redis://": {"redis": {"enabled": False,
                                                  "externalUrl": "http://redis:6379"}},
    "LMCache redis URL with a db path": {"lmcache": {"redisUrl": "redis://kv:6379/0"}},
    "sidecar without an app image": {"sidecar": {"enabled": True}},
    "service type typo": {"router": {"service": {"type": "Loadbalancer"}}},
}


@pytest.mark.parametrize("values", INVALID.values(), ids=INVALID.keys())
def test_schema_rejects(values):
    with pytest.raises(helm.HelmValuesError):
        c.render(values)


@pytest.mark.parametrize("name", sorted(p.name for p in c.EXAMPLES.glob("*.yaml")))
def test_schema_accepts_examples(name):
    c.chart().validate_schema(c.chart().merge_values(c.example_values(name)))


def test_schema_accepts_defaults():
    c.chart().validate_schema(c.chart().values)
