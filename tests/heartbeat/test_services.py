"""Settings validation: the library takes a validated ``HeartbeatServices`` only, and an invalid
setting names the parameter and its allowed range. (The ``spark.arrowbeat.heartbeat.*`` keys are
declared and parsed in ``spark_plugin.settings.config``, and tested in ``tests/spark_plugin``.)"""

from __future__ import annotations

import math

import pytest

import heartbeat.services
from heartbeat import HeartbeatConfigError, HeartbeatServices, RetryPolicy


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"interval_s": 0.0}, "interval_s"),
        ({"interval_s": -1.0}, "interval_s"),
        ({"interval_s": math.nan}, "interval_s"),
        ({"interval_s": "0.5"}, "interval_s"),
        ({"interval_s": True}, "interval_s"),
        ({"interval_s": 5.0, "timeout_s": 5.0}, "timeout_s"),
        ({"interval_s": 2.0, "timeout_s": 1.0}, "timeout_s"),
        ({"timeout_s": math.inf}, "timeout_s"),
        ({"timeout_s": "soon"}, "timeout_s"),
        ({"rpc_failure_threshold": 0}, "rpc_failure_threshold"),
        ({"rpc_failure_threshold": -2}, "rpc_failure_threshold"),
        ({"rpc_failure_threshold": 2.0}, "rpc_failure_threshold"),
        ({"rpc_failure_threshold": "3"}, "rpc_failure_threshold"),
    ],
)
def test_invalid_settings_raise_a_config_error_naming_the_parameter(
    kwargs: dict[str, object], parameter: str
) -> None:
    with pytest.raises(HeartbeatConfigError) as info:
        HeartbeatServices(**kwargs)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)
    assert info.value.parameter == parameter
    assert parameter in str(info.value) and "must be" in str(info.value)


def test_valid_settings_including_disabled_threshold() -> None:
    services = HeartbeatServices(0.2, 1.0, -1)
    assert (services.interval_s, services.timeout_s, services.rpc_failure_threshold) == (0.2, 1.0, -1)


def test_unset_settings_take_the_defaults_and_seconds_are_seconds() -> None:
    assert HeartbeatServices() == HeartbeatServices(1.0, 5.0, 2)
    services = HeartbeatServices(interval_s=0.5, rpc_failure_threshold=3)
    assert services == HeartbeatServices(0.5, 5.0, 3)
    assert HeartbeatServices(1, 500) == HeartbeatServices(1.0, 500.0), "whole seconds are fine: no units"


def test_the_library_declares_no_configuration_keys() -> None:
    """Every spark.arrowbeat.* key is declared once, in spark_plugin.settings.config."""
    assert not hasattr(HeartbeatServices, "from_conf")
    for name in ("CONFIG_KEYS", "ConfigKey", "CONF_PREFIX"):
        assert not hasattr(heartbeat, name) and not hasattr(heartbeat.services, name)


def test_retry_policy_validation() -> None:
    with pytest.raises(HeartbeatConfigError, match="max_delay_s"):
        RetryPolicy(min_delay_s=2.0, max_delay_s=1.0)
    with pytest.raises(HeartbeatConfigError, match="jitter"):
        RetryPolicy(jitter=1.5)
