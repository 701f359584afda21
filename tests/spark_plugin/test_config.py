"""The spark.arrowbeat.* registry: parsing, validation messages, and the README's table."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_plugin.config import OPTIONS, ConfigError, docs_table, load, parse_duration


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


def test_readme_lists_every_user_facing_key_as_generated() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert docs_table() in readme, "README's key table is stale: paste `python -m spark_plugin config-docs`"
    for option in OPTIONS:
        if not option.internal:
            assert f"`{option.key}`" in readme
