"""The one rate-limited logger (``arrowbeat_base.rate_log``), on a ``ManualClock``: its rate, its
counts and its bound on keys (its users' line formats are tested with them)."""

from __future__ import annotations

import logging

import pytest

from arrowbeat_base.clock import ManualClock
from arrowbeat_base.rate_log import RateLog


def test_the_rate_log_logs_once_per_key_and_interval_and_counts_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock()
    logger = logging.getLogger("tests.rate_log.limiter")
    limiter = RateLog(logger, every_s=60.0, clock=clock, max_keys=2)
    with caplog.at_level(logging.WARNING, logger=logger.name):
        assert limiter.warning("a", "refused %s", 1)
        assert not any(limiter.warning("a", "refused %s", n) for n in range(2, 50))
        assert limiter.warning("b", "refused b")
        clock.jump(59.0)
        assert not limiter.warning("a", "refused again")
        clock.jump(1.0)
        assert limiter.warning("a", "refused %s", "later")
        assert limiter.warning("c", "c") and limiter.warning("d", "d")  # bounded: old keys dropped
    messages = [r.getMessage() for r in caplog.records]
    assert messages[:3] == ["refused 1", "refused b", "refused later (49 more like it not logged)"]
    assert len(messages) == 5
    assert len(limiter) == 2 and limiter.counts() == {"c": 1, "d": 1}


def test_admit_counts_every_event_and_says_how_many_were_left_out() -> None:
    clock = ManualClock()
    rate = RateLog(None, every_s=10.0, clock=clock)
    assert rate.admit("x") == 0
    assert [rate.admit("x") for _ in range(3)] == [None, None, None]
    assert rate.admit("y") == 0, "one key does not hide another"
    clock.jump(9.5)
    assert rate.admit("x") is None
    clock.jump(0.5)
    assert rate.admit("x") == 4
    assert rate.admit("x") is None
    assert rate.counts() == {"x": 7, "y": 1}
    with pytest.raises(ValueError, match="no logger"):
        clock.jump(10.0)
        rate.warning("x", "a line with nowhere to go")
