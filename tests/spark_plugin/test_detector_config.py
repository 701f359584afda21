"""The detection mode's keys (issue 37, item 2): ``heartbeat.detector=phi`` gives the heartbeat
library its phi settings; bad values are refused naming the key and the expected form."""

from __future__ import annotations

import pytest

from spark_plugin.settings.config import ConfigError, load


def test_the_timeout_detector_is_the_default_and_has_no_phi() -> None:
    config = load({})
    assert config.heartbeat_detector == "timeout"
    assert config.heartbeat_services().phi is None


def test_phi_mode_hands_its_settings_to_the_heartbeat_library() -> None:
    config = load(
        {
            "spark.arrowbeat.heartbeat.detector": "phi",
            "spark.arrowbeat.heartbeat.interval": "100ms",
            "spark.arrowbeat.heartbeat.timeout": "2s",
            "spark.arrowbeat.heartbeat.phi.threshold": "10",
            "spark.arrowbeat.heartbeat.phi.acceptablePause": "300ms",
        }
    )
    phi = config.heartbeat_services().phi
    assert phi is not None
    assert phi.threshold == 10.0 and phi.acceptable_pause_s == pytest.approx(0.3)
    assert phi.first_interval_s == pytest.approx(0.1) and phi.min_std_s == pytest.approx(0.025)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"spark.arrowbeat.heartbeat.detector": "gossip"},
            "spark.arrowbeat.heartbeat.detector='gossip': expected timeout or phi",
        ),
        (
            {"spark.arrowbeat.heartbeat.phi.threshold": "eight"},
            "spark.arrowbeat.heartbeat.phi.threshold='eight': expected a number > 0",
        ),
        ({"spark.arrowbeat.heartbeat.phi.threshold": "nan"}, "spark.arrowbeat.heartbeat.phi.threshold='nan'"),
        (
            {"spark.arrowbeat.heartbeat.phi.threshold": "0"},
            "spark.arrowbeat.heartbeat.phi.threshold=0: expected a number > 0",
        ),
        (
            {"spark.arrowbeat.heartbeat.phi.acceptablePause": "5s"},
            "spark.arrowbeat.heartbeat.phi.acceptablePause (5s) must be below "
            "spark.arrowbeat.heartbeat.timeout (5s)",
        ),
    ],
)
def test_bad_values_name_the_key_and_the_expected_form(settings: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load(settings)
    assert message in str(raised.value)
