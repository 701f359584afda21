"""Configuration validation: invalid settings name the parameter and its allowed range."""

from __future__ import annotations

import math

import pytest

from heartbeat import CONFIG_KEYS, HeartbeatConfigError, HeartbeatServices, RetryPolicy


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"interval_s": 0.0}, "interval_s"),
        ({"interval_s": -1.0}, "interval_s"),
        ({"interval_s": math.nan}, "interval_s"),
        ({"interval_s": 5.0, "timeout_s": 5.0}, "timeout_s"),
        ({"interval_s": 2.0, "timeout_s": 1.0}, "timeout_s"),
        ({"timeout_s": math.inf}, "timeout_s"),
        ({"rpc_failure_threshold": 0}, "rpc_failure_threshold"),
        ({"rpc_failure_threshold": -2}, "rpc_failure_threshold"),
    ],
)
def test_invalid_settings_raise_a_config_error_naming_the_parameter(
    kwargs: dict[str, float], parameter: str
) -> None:
    with pytest.raises(HeartbeatConfigError) as info:
        HeartbeatServices(**kwargs)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)
    assert info.value.parameter == parameter
    assert parameter in str(info.value) and "must be" in str(info.value)


def test_valid_settings_including_disabled_threshold() -> None:
    services = HeartbeatServices(0.2, 1.0, -1)
    assert (services.interval_s, services.timeout_s, services.rpc_failure_threshold) == (0.2, 1.0, -1)


def test_from_conf_reads_spark_keys_and_defaults() -> None:
    services = HeartbeatServices.from_conf(
        {"spark.arrowbeat.heartbeat.interval": "0.5", "spark.arrowbeat.heartbeat.rpcFailureThreshold": "3"}
    )
    assert services == HeartbeatServices(0.5, 5.0, 3)
    assert {k.name for k in CONFIG_KEYS} == {"interval", "timeout", "rpcFailureThreshold"}
    with pytest.raises(HeartbeatConfigError, match=r"spark\.arrowbeat\.heartbeat\.timeout"):
        HeartbeatServices.from_conf({"spark.arrowbeat.heartbeat.timeout": "soon"})


def test_retry_policy_validation() -> None:
    with pytest.raises(HeartbeatConfigError, match="max_delay_s"):
        RetryPolicy(min_delay_s=2.0, max_delay_s=1.0)
    with pytest.raises(HeartbeatConfigError, match="jitter"):
        RetryPolicy(jitter=1.5)
