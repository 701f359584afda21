"""The Python end of the JVM launcher protocol: settings block, pulses, EOF; the protocol channel
kept apart from the log (issue 13, item 5); secrets kept out of the log."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from typing import BinaryIO

import pytest

from arrowbeat_base.clock import ManualClock
from harness.procs import wait_until
from spark_plugin.errors import (
    JvmCommandError,
    JvmLinkError,
    MalformedSettingsError,
    SettingsTruncatedError,
)
from spark_plugin.jvm.sidecar import JvmChannel, JvmLink, secret_values, wait_for_exit


def test_settings_block_is_read_and_unescaped() -> None:
    raw = b"spark.app.id\tapp-1\nmulti\tline\\none\\ttab\\\\slash\n\n"
    link = JvmLink(io.BytesIO(raw))
    assert link.read_settings() == {"spark.app.id": "app-1", "multi": "line\none\ttab\\slash"}


def test_eof_inside_settings_is_an_error() -> None:
    with pytest.raises(SettingsTruncatedError) as info:
        JvmLink(io.BytesIO(b"a\tb\n")).read_settings()
    assert isinstance(info.value, EOFError) and isinstance(info.value, JvmLinkError)


def test_malformed_settings_line_is_rejected_without_echoing_it() -> None:
    """The line may be a secret's value: the error says where, not what."""
    with pytest.raises(MalformedSettingsError, match="malformed settings line 2") as info:
        JvmLink(io.BytesIO(b"a\tb\nspark.arrowbeat.authenticate.secretXYZ-not-a-tab\n\n")).read_settings()
    assert isinstance(info.value, ValueError) and isinstance(info.value, JvmLinkError)
    assert "XYZ" not in str(info.value)


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


@pytest.fixture
def own_signal_handlers() -> Iterator[None]:
    """``wait_for_exit`` installs SIGTERM and SIGINT handlers: pytest's come back afterwards."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def signal_then_write(link: JvmLink, jvm: BinaryIO, lines: bytes) -> threading.Thread:
    """SIGTERM to this process, then, once the handler has run (``gone`` set), ``lines`` from the
    "JVM": the order in which a container's end delivers them. It signals once ``wait_for_exit``
    has put its handler in place."""
    before = signal.getsignal(signal.SIGTERM)

    def run() -> None:
        assert wait_until(lambda: signal.getsignal(signal.SIGTERM) is not before, timeout_s=10)
        os.kill(os.getpid(), signal.SIGTERM)
        assert link.gone.wait(10.0)
        if lines:
            jvm.write(lines)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@contextlib.contextmanager
def piped_link() -> Iterator[tuple[JvmLink, BinaryIO]]:
    """A started link reading a pipe, and the pipe's unbuffered write end (the "JVM"), closed
    afterwards (closing it again is a no-op, so a test may play EOF itself)."""
    read_fd, write_fd = os.pipe()
    with os.fdopen(read_fd, "rb") as reader, os.fdopen(write_fd, "wb", buffering=0) as jvm:
        link = JvmLink(reader)
        link.start()
        yield link, jvm


@pytest.mark.usefixtures("own_signal_handlers")
def test_a_signal_followed_by_the_jvms_exit_notice_is_an_orderly_shutdown() -> None:
    """A process-group SIGTERM reaches us a moment before the JVM's shutdown hook says ``exiting``:
    the end is the JVM's shutdown, never a bare signal (the history would call it something else)."""
    with piped_link() as (link, jvm):
        sender = signal_then_write(link, jvm, b"exiting\n")
        assert wait_for_exit(link, word_grace_s=30.0) == "the JVM shut down (SIGTERM or exit)"
        sender.join()


@pytest.mark.usefixtures("own_signal_handlers")
def test_the_jvms_stop_wins_over_the_sigterm_that_escalates_it() -> None:
    with piped_link() as (link, jvm):
        jvm.write(b"stop\n")
        assert wait_until(link.stop_requested.is_set, timeout_s=10)
        sender = signal_then_write(link, jvm, b"")
        assert wait_for_exit(link, word_grace_s=30.0) == "stopped by the JVM"
        sender.join()


@pytest.mark.usefixtures("own_signal_handlers")
def test_a_signal_without_a_word_from_the_live_jvm_names_the_signal() -> None:
    with piped_link() as (link, jvm):
        sender = signal_then_write(link, jvm, b"")
        assert wait_for_exit(link, word_grace_s=0.2) == "SIGTERM"
        sender.join()


@pytest.mark.usefixtures("own_signal_handlers")
def test_eof_without_a_word_is_a_dead_jvm() -> None:
    with piped_link() as (link, jvm):
        jvm.close()
        assert wait_for_exit(link) == "the JVM exited unexpectedly"


def written(channel_calls: list[tuple[str, tuple[object, ...], dict[str, object]]]) -> bytes:
    """What a fresh channel writes for ``channel_calls``; refused calls must raise and write nothing."""
    out = io.BytesIO()
    channel = JvmChannel(out)
    for name, args, kwargs in channel_calls:
        getattr(channel, name)(*args, **kwargs)
    return out.getvalue()


def test_the_channel_writes_the_ready_line_and_a_kill() -> None:
    assert (
        written(
            [
                ("announce_ready", (), {"address": "127.0.0.1:7077", "pid": 12, "pulse_ms": 500}),
                ("kill_executor", ("3",), {}),
            ]
        )
        == b"ARROWBEAT-READY address=127.0.0.1:7077 pid=12 pulse_ms=500\nARROWBEAT-CMD kill-executor 3\n"
    )


def test_a_kill_for_a_heartbeat_timeout_is_the_lost_executor_command() -> None:
    """The router's kill (``lost_executor``) is its own verb: only it makes the driver JVM tell
    Spark's scheduler the executor is lost; an id the JVM would refuse is not written."""
    assert written([("lost_executor", ("3",), {})]) == b"ARROWBEAT-CMD lost-executor 3\n"
    out = io.BytesIO()
    with pytest.raises(JvmCommandError):
        JvmChannel(out).lost_executor("driver")
    assert out.getvalue() == b""


def test_the_ready_line_carries_a_generated_certificate_and_refuses_other_long_values() -> None:
    from spark_plugin.settings import tls

    fields = tls.ready_fields(tls.generate_self_signed())
    line = written([("announce_ready", (), {"address": "127.0.0.1:7077", **fields})]).decode()
    assert line.startswith("ARROWBEAT-READY address=127.0.0.1:7077 ssl_cert=") and len(line) < 2048
    for name, value in (("ssl_cert", "not base64!"), ("ssl_key_secret", "A" * 1025), ("address", "A" * 257)):
        with pytest.raises(JvmCommandError):
            written([("announce_ready", (), {name: value})])


@pytest.mark.parametrize(
    "executor_id",
    ["", "driver", "../1", "1 2", "1\nARROWBEAT-CMD kill-executor 2", "-1", "1" * 65, "\u202e1", "é"],
)
def test_a_kill_for_an_id_the_jvm_would_refuse_is_not_written(executor_id: str) -> None:
    out = io.BytesIO()
    with pytest.raises(JvmCommandError) as info:
        JvmChannel(out).kill_executor(executor_id)
    assert out.getvalue() == b""
    assert isinstance(info.value, ValueError) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    "info",
    [{"address": "a b"}, {"address": "x\nARROWBEAT-CMD kill-executor 1"}, {"Bad": "1"}, {"address": ""}],
)
def test_a_ready_field_of_the_wrong_form_is_not_written(info: dict[str, object]) -> None:
    out = io.BytesIO()
    with pytest.raises(JvmCommandError):
        JvmChannel(out).announce_ready(**info)
    assert out.getvalue() == b""


CHILD = textwrap.dedent(
    """
    import logging, os, subprocess, sys
    from spark_plugin.jvm.sidecar import JvmChannel, setup_logging
    print("before the claim")  # start-up noise: on the original stdout, the JVM refuses it
    channel = JvmChannel.claim_stdout()
    setup_logging("debug", ["s3cret-value-123456"])
    print("ARROWBEAT-CMD kill-executor 1", flush=True)
    sys.stdout.write("ARROWBEAT-READY address=evil:1\\n"); sys.stdout.flush()
    os.write(1, b"ARROWBEAT-CMD kill-executor 2\\n")
    subprocess.run(["sh", "-c", "echo ARROWBEAT-CMD kill-executor 3"], check=True)
    logging.getLogger("t").info("reason from the wire\\nARROWBEAT-CMD kill-executor 4")
    logging.getLogger("t").info("the secret is %s", "s3cret-value-123456")
    try:
        raise RuntimeError("failed with s3cret-value-123456")
    except RuntimeError:
        logging.getLogger("t").exception("and in a traceback")
    channel.announce_ready(address="127.0.0.1:1", pid=os.getpid())
    channel.kill_executor("5")
    print("protocol descriptor inheritable:", os.get_inheritable(channel._stream.fileno()), file=sys.stderr)
    """
)


def test_after_the_claim_only_protocol_lines_reach_stdout() -> None:
    """Stray prints, ``sys.stdout``, ``os.write(1)``, a subprocess's output and log lines (a
    wire reason with a newline included) all land on stderr; stdout carries the ready line and
    the command and nothing else after the claim; the protocol descriptor is not inherited by
    child processes (no subprocess can write to it); the secret is redacted from every log line,
    exception messages included."""
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "before the claim",
        f"ARROWBEAT-READY address=127.0.0.1:1 pid={done.stdout.split('pid=')[1].split()[0]}",
        "ARROWBEAT-CMD kill-executor 5",
    ]
    err = done.stderr.splitlines()
    for n in (1, 2, 3, 4):
        assert any(line.endswith(f"ARROWBEAT-CMD kill-executor {n}") for line in err), done.stderr
    assert "ARROWBEAT-READY address=evil:1" in err
    assert "s3cret-value-123456" not in done.stderr
    # the log message and the exception's message (Python 3.13 also prints the ``-c`` source line)
    assert any(line.endswith("INFO t: the secret is <redacted>") for line in err), done.stderr
    assert "RuntimeError: failed with <redacted>" in err, done.stderr
    assert "protocol descriptor inheritable: False" in err


def test_secret_values_are_the_values_of_secret_keys() -> None:
    settings = {
        "spark.arrowbeat.authenticate.secret": "abcdefghijklmnop",
        "spark.ssl.keyPassword": "hunter22",
        "spark.app.name": "secret-app-name-is-not-a-secret-key",
        "spark.some.token": "tiny",  # too short to be worth redacting
    }
    assert secret_values(settings) == ["abcdefghijklmnop", "hunter22"]


def test_an_agent_reports_lost_outputs_in_the_one_form_the_jvm_accepts() -> None:
    """Issue 14, item 3: ``outputs-lost <reason>`` is the only command an agent may give."""
    out = io.BytesIO()
    JvmChannel(out).outputs_lost("files-missing")
    assert out.getvalue() == b"ARROWBEAT-CMD outputs-lost files-missing\n"
    for reason in ("", "Files", "a b", "x\nARROWBEAT-CMD kill-executor 1", "r" * 33, "-x"):
        refused = io.BytesIO()
        with pytest.raises(JvmCommandError):
            JvmChannel(refused).outputs_lost(reason)
        assert refused.getvalue() == b""
