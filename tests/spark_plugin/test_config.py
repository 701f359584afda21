"""The spark.arrowbeat.* registry: parsing, validation messages, the heartbeat library's settings
built from it, the driver-side reading of a SparkConf, and the site's configuration reference."""

from __future__ import annotations

from pathlib import Path

import pytest

from heartbeat.services import HeartbeatServices
from spark_plugin.errors import PluginError
from spark_plugin.settings.config import (
    OPTIONS,
    ConfigError,
    declared_default,
    docs_table,
    early_value,
    from_spark_conf,
    load,
)
from spark_plugin.settings.units import parse_duration


def test_defaults_parse_and_are_consistent() -> None:
    config = load({})
    assert config.heartbeat_interval_s == 1.0
    assert config.heartbeat_timeout_s == 5.0
    assert config.rpc_failure_threshold == 2


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("500ms", 0.5), ("2s", 2.0), ("1min", 60.0), ("1.5s", 1.5), ("250", 0.25), ("3m", 180.0)],
)
def test_durations_follow_spark_format(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "fast", "1 sec", "-1s", "1s2"])
def test_malformed_durations_are_rejected(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_every_problem_is_reported_with_its_key_and_expected_form() -> None:
    with pytest.raises(ConfigError) as info:
        load(
            {
                "spark.arrowbeat.heartbeat.interval": "soon",
                "spark.arrowbeat.rm.port": "99999",
                "spark.arrowbeat.heartbeat.timout": "3s",
                "spark.arrowbeat.heartbeat.rpcFailureThreshold": "0",
                "spark.other.key": "ignored",
            }
        )
    problems = info.value.problems
    assert any("spark.arrowbeat.heartbeat.interval='soon': expected a duration" in p for p in problems)
    assert any("spark.arrowbeat.rm.port=99999" in p and "0 to 65535" in p for p in problems)
    assert any("unknown key spark.arrowbeat.heartbeat.timout" in p for p in problems)
    assert any("rpcFailureThreshold=0" in p and ">= 1, or -1" in p for p in problems)
    assert not any("spark.other.key" in p for p in problems)


def test_interval_must_be_below_timeout() -> None:
    with pytest.raises(ConfigError, match=r"interval .* must be smaller than .*timeout"):
        load({"spark.arrowbeat.heartbeat.interval": "5s", "spark.arrowbeat.heartbeat.timeout": "5s"})


def test_a_bad_secret_is_named_but_never_shown() -> None:
    with pytest.raises(ConfigError) as info:
        load({"spark.arrowbeat.authenticate.secret": "short-secret"})
    assert "authenticate.secret" in str(info.value)
    assert "short-secret" not in str(info.value)


def test_config_error_is_the_plugins_and_a_value_error() -> None:
    with pytest.raises(ConfigError) as info:
        load({"spark.arrowbeat.rm.port": "none"})
    assert isinstance(info.value, PluginError) and isinstance(info.value, ValueError)


# The heartbeat library has no key table of its own: its settings come from these declarations.


def test_heartbeat_services_carry_the_declared_defaults() -> None:
    assert load({}).heartbeat_services() == HeartbeatServices(1.0, 5.0, 2)


def test_heartbeat_services_read_the_spark_keys() -> None:
    services = load(
        {
            "spark.arrowbeat.heartbeat.interval": "250ms",
            "spark.arrowbeat.heartbeat.timeout": "3s",
            "spark.arrowbeat.heartbeat.rpcFailureThreshold": "-1",
        }
    ).heartbeat_services()
    assert services == HeartbeatServices(0.25, 3.0, -1)


def test_a_bare_number_is_milliseconds_as_in_spark() -> None:
    """``500`` is 500 ms (Spark's time format), not 500 s."""
    services = load(
        {"spark.arrowbeat.heartbeat.interval": "500", "spark.arrowbeat.heartbeat.timeout": "2000"}
    ).heartbeat_services()
    assert services.interval_s == pytest.approx(0.5)
    assert services.timeout_s == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("spark.arrowbeat.heartbeat.interval", "often", "a duration like 1s or 500ms"),
        ("spark.arrowbeat.heartbeat.timeout", "soon", "a duration like 5s"),
        ("spark.arrowbeat.heartbeat.rpcFailureThreshold", "two", "an integer >= 1, or -1 to disable"),
    ],
)
def test_a_bad_heartbeat_value_is_named_with_its_expected_form(key: str, value: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load({key: value})
    assert f"{key}={value!r}: expected {expected}" in info.value.problems


@pytest.mark.parametrize(("interval", "timeout"), [("5s", "5s"), ("2s", "1s"), ("1000", "1s")])
def test_a_heartbeat_interval_not_below_its_timeout_is_refused(interval: str, timeout: str) -> None:
    with pytest.raises(
        ConfigError, match=r"heartbeat\.interval .* must be smaller than .*heartbeat\.timeout"
    ):
        load({"spark.arrowbeat.heartbeat.interval": interval, "spark.arrowbeat.heartbeat.timeout": timeout})


# The user's driver reads its SparkConf (and the session's runtime conf) through the same table.


def test_from_spark_conf_takes_the_arrowbeat_entries_and_ignores_the_rest() -> None:
    config = from_spark_conf(
        [
            ("spark.app.id", "app-1"),
            ("spark.master", "local[2]"),
            ("spark.arrowbeat.shuffle.mapMemory", "64m"),
            ("spark.arrowbeat.heartbeat.interval", "500"),
        ]
    )
    assert config.shuffle_map_memory_bytes == 64 << 20
    assert config.heartbeat_interval_s == pytest.approx(0.5)
    assert config.shuffle_read_host_local is True  # declared default


def test_the_sessions_runtime_conf_overrides_the_application_conf() -> None:
    entries = [("spark.arrowbeat.shuffle.readHostLocalDisk", "true"), ("spark.arrowbeat.shuffle.dir", "/a")]
    overrides = {"spark.arrowbeat.shuffle.readHostLocalDisk": "FALSE", "spark.sql.shuffle.partitions": "x"}
    config = from_spark_conf(entries, overrides)
    assert config.shuffle_read_host_local is False
    assert config.shuffle_dir == "/a"
    assert from_spark_conf(entries).shuffle_read_host_local is True


def test_from_spark_conf_names_bad_and_unknown_keys() -> None:
    with pytest.raises(ConfigError) as info:
        from_spark_conf(
            [("spark.arrowbeat.shuffle.mapMemory", "lots")],
            {"spark.arrowbeat.shuffle.readHostLocalDisk": "maybe", "spark.arrowbeat.shuffle.dri": "/x"},
        )
    problems = info.value.problems
    assert "spark.arrowbeat.shuffle.mapMemory='lots': expected a size like 32m" in problems
    assert "spark.arrowbeat.shuffle.readHostLocalDisk='maybe': expected true or false" in problems
    assert any("unknown key spark.arrowbeat.shuffle.dri " in p for p in problems)


def test_early_values_fall_back_to_the_declared_default_and_load_names_the_problem() -> None:
    """The processes set up logging from the log level before the whole config is validated."""
    key = "spark.arrowbeat.log.level"
    assert early_value({key: "debug"}, key) == "DEBUG"
    assert early_value({key: "chatty"}, key) == early_value({}, key) == declared_default(key) == "INFO"
    with pytest.raises(ConfigError, match=r"spark\.arrowbeat\.log\.level='chatty'"):
        load({key: "chatty"})


def test_library_defaults_agree_with_the_declarations() -> None:
    from spark_plugin.history.tables import DEFAULT_RETENTION_S
    from spark_plugin.history.writer import DEFAULT_COMPACT_INTERVAL_S

    config = load({})
    assert DEFAULT_RETENTION_S == config.tables_retention_s == 3600.0
    assert DEFAULT_COMPACT_INTERVAL_S == config.tables_compact_interval_s == 60.0


def test_the_site_lists_every_user_facing_key_as_declared() -> None:
    """The configuration reference is generated from the declarations when the site is built."""
    from scripts.docs_site import expand

    page = (Path(__file__).resolve().parents[2] / "docs/reference/configuration.md").read_text()
    shown = expand(page)
    assert docs_table() in shown
    for option in OPTIONS:
        assert (f"| `{option.key}` |" in shown) is not option.internal, option.key


# --- the shuffle agent's buffer-reserve deadline (issue 24, item 4(d)) ---------------------------

RESERVE_KEY = "spark.arrowbeat.shuffle.bufferReserveTimeout"


@pytest.mark.parametrize("text", ["0s", "2d", "soon", "-1s"])
def test_a_bad_buffer_reserve_timeout_is_refused_naming_the_key(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        load({RESERVE_KEY: text})
    assert any(p.startswith(RESERVE_KEY) for p in info.value.problems), info.value.problems


def test_the_buffer_reserve_timeout_reaches_the_agents_engine_config() -> None:
    from arrow_shuffle import ShuffleConfig
    from spark_plugin.processes.executor import agent_shuffle_config

    assert load({}).shuffle_buffer_reserve_timeout_s == ShuffleConfig().buffer_reserve_timeout_s == 300.0
    engine = agent_shuffle_config(load({RESERVE_KEY: "45s", "spark.arrowbeat.shuffle.agentMemory": "8m"}))
    assert engine.buffer_reserve_timeout_s == 45.0
    assert engine.network_memory_bytes == 8 << 20
