"""Configuration: flags > PREFIX_ROUTER_* env > YAML file > defaults, coercion, validation."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from router.config import ConfigError, RouterConfig, load_config, parse_workers


def write_yaml(tmp_path: Path, text: str) -> str:
    path = tmp_path / "router.yaml"
    path.write_text(text)
    return str(path)


def test_defaults_when_nothing_is_set() -> None:
    assert load_config({}, {}) == RouterConfig()


@pytest.mark.parametrize("flag, env, yaml", list(itertools.product([False, True], repeat=3)))
def test_the_highest_source_present_wins(tmp_path: Path, flag: bool, env: bool,
                                         yaml: bool) -> None:
    args: dict[str, object] = {}
    environ: dict[str, str] = {}
    if yaml:
        args["config"] = write_yaml(tmp_path, "bound_epsilon: 0.5\nport: 9001\n")
    if env:
        environ.update(PREFIX_ROUTER_BOUND_EPSILON="0.6", PREFIX_ROUTER_PORT="9002")
    if flag:
        args.update(bound_epsilon="0.7", port="9003")
    config = load_config(args, environ)
    expected = ((0.7, 9003) if flag else (0.6, 9002) if env else (0.5, 9001) if yaml
                else (RouterConfig.bound_epsilon, RouterConfig.port))
    assert (config.bound_epsilon, config.port) == expected


def test_sources_merge_field_by_field(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "policy: round_robin\nslack_s: 0.5\nretry-attempts: 5\n")
    config = load_config({"config": path, "slack_s": "0.9", "port": None},
                         {"PREFIX_ROUTER_RETRY_ATTEMPTS": "4"})
    assert (config.policy, config.slack_s, config.retry_attempts) == ("round_robin", 0.9, 4)
    assert config.port == RouterConfig.port  # a flag left at None is not set


def test_the_config_file_can_come_from_the_environment(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "max_blocks: 12\n")
    assert load_config({}, {"PREFIX_ROUTER_CONFIG": path}).max_blocks == 12


@pytest.mark.parametrize("raw, expected", [
    ("1", True), ("true", True), ("YES", True), (" on ", True), (True, True),
    ("0", False), ("false", False), ("No", False), ("off", False), ("", False), (False, False),
])
def test_bool_coercion(raw: object, expected: bool) -> None:
    assert load_config({"discover": raw}, {}).discover is expected
    if isinstance(raw, str):
        assert load_config({}, {"PREFIX_ROUTER_ROUTER_HEADERS": raw}).router_headers is expected


def test_int_and_float_coercion(tmp_path: Path) -> None:
    config = load_config({"port": "8123", "slack_ratio": "0.125"},
                         {"PREFIX_ROUTER_BLOCK_CHARS": "64", "PREFIX_ROUTER_SLACK_S": "1"})
    assert (config.port, config.slack_ratio, config.block_chars, config.slack_s) == \
        (8123, 0.125, 64, 1.0)
    assert isinstance(config.slack_s, float) and isinstance(config.port, int)
    yaml = load_config({"config": write_yaml(tmp_path, "discover: yes\nkey_blocks: 8\n")}, {})
    assert (yaml.discover, yaml.key_blocks) == (True, 8)


@pytest.mark.parametrize("field, raw", [
    ("discover", "maybe"), ("port", "eighty"), ("port", "80.5"), ("bound_epsilon", "lots"),
    ("bound_epsilon", "-1"), ("bound_epsilon", "0"), ("port", "70000"), ("policy", "random"),
    ("warm_ratio", "0"), ("warm_ratio", "1.5"), ("retry_attempts", "0"),
    ("retry_backoff_s", "-0.1"), ("redis_url", "http://localhost:6379"),
    ("log_level", "loud"), ("log_format", "xml"), ("max_body_bytes", "0"),
])
def test_invalid_values_name_their_field(field: str, raw: str) -> None:
    for args, env in (({field: raw}, {}), ({}, {"PREFIX_ROUTER_" + field.upper(): raw})):
        with pytest.raises(ConfigError, match=rf"^invalid config: {field}: "):
            load_config(args, env)


def test_validation_applies_to_yaml_values(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "health_interval_s: -2\n")
    with pytest.raises(ConfigError, match="health_interval_s"):
        load_config({"config": path}, {})
    # a valid flag over an invalid file value wins before validation
    assert load_config({"config": path, "health_interval_s": "3"}, {}).health_interval_s == 3


def test_unknown_yaml_keys_are_rejected(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "port: 8000\nbound_epsilom: 0.3\n")
    with pytest.raises(ConfigError, match="bound_epsilom: unknown setting"):
        load_config({"config": path}, {})


@pytest.mark.parametrize("text", ["- a\n- b\n", "port: [unclosed\n"])
def test_a_yaml_file_that_is_not_a_mapping_is_rejected(tmp_path: Path, text: str) -> None:
    with pytest.raises(ConfigError, match=r"^invalid config: config: "):
        load_config({"config": write_yaml(tmp_path, text)}, {})


def test_a_missing_yaml_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config({"config": str(tmp_path / "absent.yaml")}, {})


def test_unknown_env_vars_are_ignored() -> None:
    assert load_config({}, {"PREFIX_ROUTER_NOT_A_FIELD": "1", "OTHER": "x"}) == RouterConfig()


# -- workers ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("raw, expected", [
    ("http://a:1,http://b:2/", (("w0", "http://a:1"), ("w1", "http://b:2"))),
    (" http://a:1 , , https://b:2 ", (("w0", "http://a:1"), ("w1", "https://b:2"))),
    ("gpu0=http://a:1,gpu1=http://b:2", (("gpu0", "http://a:1"), ("gpu1", "http://b:2"))),
    ("x=http://h:1/?q=1", (("x", "http://h:1/?q=1"),)),  # only the first '=' names
    ("", ()),
])
def test_workers_parsing(raw: str, expected: tuple) -> None:
    assert parse_workers(raw) == expected
    assert load_config({"workers": raw}, {}).workers == expected


def test_workers_from_yaml_lists(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "workers:\n  - http://a:1\n  - b=http://b:2\n"
                                "  - {id: c, url: 'http://c:3/'}\n")
    assert load_config({"config": path}, {}).workers == (
        ("w0", "http://a:1"), ("b", "http://b:2"), ("c", "http://c:3"))


@pytest.mark.parametrize("raw, message", [
    ("a=http://x:1,a=http://y:2", "duplicate worker id"),
    ("http://x:1,w0=http://y:2", "duplicate worker id"),
    ("ftp://x:1", "is not an http"),
    ("x:8000", "is not an http"),
    ("a=localhost:8000", "is not an http"),
])
def test_bad_workers_are_rejected(raw: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_workers(raw)
    with pytest.raises(ConfigError, match=r"^invalid config: workers: "):
        load_config({}, {"PREFIX_ROUTER_WORKERS": raw})
