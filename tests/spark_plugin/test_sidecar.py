"""The Python end of the JVM launcher protocol: settings block, pulses, EOF."""

from __future__ import annotations

import io
import os

import pytest

from heartbeat.clock import ManualClock
from spark_plugin.errors import JvmLinkError, MalformedSettingsError, SettingsTruncatedError
from spark_plugin.sidecar import JvmLink
from tests.procs import wait_until


def test_settings_block_is_read_and_unescaped() -> None:
    raw = b"spark.app.id\tapp-1\nmulti\tline\\none\\ttab\\\\slash\n\n"
    link = JvmLink(io.BytesIO(raw))
    assert link.read_settings() == {"spark.app.id": "app-1", "multi": "line\none\ttab\\slash"}


def test_eof_inside_settings_is_an_error() -> None:
    with pytest.raises(SettingsTruncatedError) as info:
        JvmLink(io.BytesIO(b"a\tb\n")).read_settings()
    assert isinstance(info.value, EOFError) and isinstance(info.value, JvmLinkError)


def test_malformed_settings_line_is_rejected() -> None:
    with pytest.raises(MalformedSettingsError, match="malformed settings line") as info:
        JvmLink(io.BytesIO(b"no-tab-here\n\n")).read_settings()
    assert isinstance(info.value, ValueError) and isinstance(info.value, JvmLinkError)


def test_pulses_reset_the_age_and_carry_running_tasks_and_eof_means_gone() -> None:
    clock = ManualClock(start=100.0)
    read_fd, write_fd = os.pipe()
    with os.fdopen(read_fd, "rb") as reader, os.fdopen(write_fd, "wb", buffering=0) as writer:
        link = JvmLink(reader, clock=clock)
        link.start()
        clock.jump(3.0)
        assert link.pulse_age_s() == pytest.approx(3.0)
        writer.write(b"p 4\n")
        # The pulse is handled on the link's thread: wait on the observable effect.
        assert wait_until(lambda: link.running_tasks() == 4, timeout_s=10)
        assert link.pulse_age_s() == pytest.approx(0.0)
        clock.jump(1.5)
        assert link.pulse_age_s() == pytest.approx(1.5)
        writer.write(b"garbage\n")  # still proof of life, running tasks unchanged
        assert wait_until(lambda: link.pulse_age_s() == 0.0, timeout_s=10)
        assert not link.gone.is_set()
    assert link.gone.wait(10.0), "EOF on stdin must mark the JVM as gone"
    assert link.running_tasks() == 4


def test_stop_line_tells_an_orderly_stop_from_a_dead_jvm() -> None:
    read_fd, write_fd = os.pipe()
    with os.fdopen(read_fd, "rb") as reader:
        link = JvmLink(reader)
        link.start()
        with os.fdopen(write_fd, "wb", buffering=0) as writer:
            writer.write(b"app app-20261122-0001\nstop\n")
        assert link.gone.wait(10.0)
    assert link.stop_requested.is_set()
    assert link.app_id() == "app-20261122-0001"


def test_eof_without_stop_means_the_jvm_died() -> None:
    read_fd, write_fd = os.pipe()
    with os.fdopen(read_fd, "rb") as reader:
        link = JvmLink(reader)
        link.start()
        os.close(write_fd)
        assert link.gone.wait(10.0)
    assert not link.stop_requested.is_set()
    assert link.app_id("fallback") == "fallback"
