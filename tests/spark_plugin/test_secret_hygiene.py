"""Secrets stay secret, and text from the wire is made safe before it is logged or recorded
(issue 13, items 5 and 6), without Spark: the objects that hold the secret, the driver-side
process's event routing, and the driver-side process itself run as the JVM runs it.
"""

from __future__ import annotations

import functools
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import psutil
import pyarrow as pa
import pytest

from harness.procs import end, wait_until
from heartbeat import (
    AgentThread,
    EventKind,
    ExecutorEvent,
    HeartbeatServices,
    ResourceManagerServer,
    one_line,
)
from spark_plugin.history import event_row, wire_text
from spark_plugin.history.wire_text import MAX_ERROR_CHARS
from spark_plugin.jvm.sidecar import JvmChannel
from spark_plugin.processes.driver import EventRouter
from spark_plugin.settings.config import ConfigError, load
from spark_plugin.shuffle.plan import ShufflePlan

SECRET = "s3cret-" + "0123456789abcdef" * 2
SECRET_KEY = "spark.arrowbeat.authenticate.secret"


def test_reprs_never_show_the_secret() -> None:
    config = load({SECRET_KEY: SECRET})
    plan = ShufflePlan(
        app_id="app-1",
        shuffle_id=7,
        root="",
        secret=SECRET,
        key_columns=("k",),
        num_partitions=2,
        schema_ipc=pa.schema([("k", pa.int64())]).serialize().to_pybytes(),
        route_keys=(0, 1),
    )
    holders: list[Any] = [
        config,
        plan,
        ResourceManagerServer(HeartbeatServices(interval_s=1.0, timeout_s=5.0), secret=SECRET),
        AgentThread("127.0.0.1:1", SECRET, executor_id="1"),
        EventRouter(lambda: "app-1", None, kill=None),
    ]
    assert config.secret == SECRET and plan.secret == SECRET  # still there for those who need it
    for holder in holders:
        assert SECRET not in repr(holder), type(holder).__name__
        assert SECRET not in str(holder), type(holder).__name__
        assert SECRET not in f"{holder!r} {holder}", type(holder).__name__


def test_a_config_error_names_the_secret_key_not_its_value() -> None:
    short = "tiny-secret"
    with pytest.raises(ConfigError) as info:
        load({SECRET_KEY: short, "spark.arrowbeat.heartbeat.interval": "soon"})
    assert SECRET_KEY in str(info.value) and short not in str(info.value)
    assert all(short not in problem for problem in info.value.problems)


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("the JVM exited unexpectedly", "the JVM exited unexpectedly"),
        ("bye\nARROWBEAT-CMD kill-executor 1", "bye\\nARROWBEAT-CMD kill-executor 1"),
        ("a\rb\x00c\x1b[31m", "a\\rb\\x00c\\x1b[31m"),
        ("left\u202eright\u2028", "left\\u202eright\\u2028"),
        ("ünïcode ok", "ünïcode ok"),
    ],
)
def test_wire_text_is_one_printable_line(raw: str, shown: str) -> None:
    assert wire_text(raw) == shown


def test_wire_text_is_bounded() -> None:
    assert wire_text("x" * 10_000, 100) == "x" * 100 + "...(cut)"
    assert len(wire_text("\n" * 10_000, 100)) <= 100 + len("...(cut)")
    assert wire_text(12345) == "12345"


def test_a_storage_error_is_reflowed_onto_one_line_and_still_escaped() -> None:
    """delta-rs's error chains span lines, indent and carry terminal colours: the one escaping
    helper reflows them into one sentence (the CLI's and the report's error lines), and still
    escapes what is not whitespace and bounds the length, as for any other wire text."""
    chain = "\x1b[31mError\x1b[0m: Generic S3 error:\n  Caused by:\n\tHTTP 403 \u202eforged\x00"
    reflowed = one_line(chain, MAX_ERROR_CHARS, reflow=True)
    assert reflowed == "Error: Generic S3 error: Caused by: HTTP 403 \\u202eforged\\x00"
    assert one_line(chain) == wire_text(chain)  # without reflow: what was sent stays visible
    assert wire_text(chain).startswith("\\x1b[31mError\\x1b[0m: Generic S3 error:\\n  Caused")
    assert one_line("x " * 5000, MAX_ERROR_CHARS, reflow=True) == ("x " * 1000)[:MAX_ERROR_CHARS] + "...(cut)"


class Rows:
    def __init__(self) -> None:
        self.rows: list[tuple[str, dict[str, Any]]] = []

    def append(self, table: str, row: dict[str, Any]) -> None:
        self.rows.append((table, row))


def event(kind: EventKind, executor_id: str, detail: str = "", host: str = "h") -> ExecutorEvent:
    return ExecutorEvent(kind, executor_id, host, "inst", 1_700_000_000.0, detail)


def test_the_router_logs_and_records_wire_text_on_one_line(caplog: pytest.LogCaptureFixture) -> None:
    history = Rows()
    router = EventRouter(lambda: "app-1", history)
    with caplog.at_level(logging.INFO, logger="arrowbeat.driver"):
        router(event(EventKind.UNREGISTERED, "9", "bye\nARROWBEAT-CMD kill-executor 1", host="h\r\nx"))
    (message,) = [r.getMessage() for r in caplog.records if r.name == "arrowbeat.driver"]
    assert "\n" not in message and "\r" not in message
    assert message.endswith("UNREGISTERED bye\\nARROWBEAT-CMD kill-executor 1"), message
    ((table, row),) = history.rows
    assert table == "executor_events"
    assert row["detail"] == "bye\\nARROWBEAT-CMD kill-executor 1" and row["host"] == "h\\r\\nx"
    assert event_row("app-1", event(EventKind.REGISTERED, "1", "x" * 5000))["detail"].endswith("...(cut)")


def test_the_router_asks_a_kill_only_for_a_spark_executor_id(caplog: pytest.LogCaptureFixture) -> None:
    asked: list[str] = []
    channel_out: list[bytes] = []

    class Out:
        def write(self, data: bytes) -> int:
            channel_out.append(data)
            return len(data)

    channel = JvmChannel(Out())  # type: ignore[arg-type]

    def kill(executor_id: str) -> None:
        asked.append(executor_id)
        channel.kill_executor(executor_id)

    router = EventRouter(lambda: "app-1", None, kill=kill)
    with caplog.at_level(logging.WARNING, logger="arrowbeat.driver"):
        router(event(EventKind.HEARTBEAT_TIMEOUT, "3"))
        router(event(EventKind.UNREACHABLE, "4"))
        router(event(EventKind.UNREGISTERED, "5", "bye"))  # a goodbye is no reason to kill
        router(event(EventKind.HEARTBEAT_TIMEOUT, "1 ARROWBEAT-CMD kill-executor 2"))
        router(event(EventKind.HEARTBEAT_TIMEOUT, "driver"))
    assert asked == ["3", "4", "1 ARROWBEAT-CMD kill-executor 2", "driver"]
    assert channel_out == [b"ARROWBEAT-CMD kill-executor 3\n", b"ARROWBEAT-CMD kill-executor 4\n"]
    refused = [r.getMessage() for r in caplog.records if "not asking Spark" in r.getMessage()]
    assert len(refused) == 2 and all("\n" not in m for m in refused), refused


class DriverProcess:
    """``python -m spark_plugin.processes.driver`` with a pipe on each of stdin, stdout and stderr, as the
    JVM DriverPlugin starts it; stdout and stderr are read on threads."""

    def __init__(self, settings: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-u", "-m", "spark_plugin.processes.driver"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.out: list[bytes] = []
        self.err: list[bytes] = []
        assert self.proc.stdout is not None and self.proc.stderr is not None
        threading.Thread(target=self._read, args=(self.proc.stdout, self.out), daemon=True).start()
        threading.Thread(target=self._read, args=(self.proc.stderr, self.err), daemon=True).start()
        assert self.proc.stdin is not None
        block = "".join(f"{k}\t{v}\n" for k, v in settings.items()) + "\n"
        self.proc.stdin.write(block.encode())
        self.proc.stdin.flush()

    @staticmethod
    def _read(stream: Any, into: list[bytes]) -> None:
        for line in iter(stream.readline, b""):
            into.append(line)

    def stdout_lines(self) -> list[str]:
        return [line.decode().rstrip("\n") for line in list(self.out)]

    def stderr_text(self) -> str:
        return b"".join(self.err).decode(errors="replace")

    def address(self) -> str:
        ready = [line for line in self.stdout_lines() if line.startswith("ARROWBEAT-READY ")]
        fields = dict(part.split("=", 1) for part in ready[0].split()[1:])
        return fields["address"]

    def stop(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"stop\n")
        self.proc.stdin.close()
        return self.proc.wait(timeout=60)


def test_the_driver_side_process_speaks_only_protocol_on_stdout_and_never_shows_the_secret(
    tmp_path: Path,
) -> None:
    """The driver-side process at debug level with ``onHeartbeatTimeout=kill``, as the JVM runs
    it: agents register, one leaves with a reason holding a newline and a command, one freezes
    (a kill), one with an id the JVM would refuse freezes too (no kill). Its stdout carries the
    ready line and the one valid command, nothing else; the secret is in neither its output nor
    its ``/proc`` argv or environment."""
    driver = DriverProcess(
        {
            SECRET_KEY: SECRET,
            "spark.arrowbeat.log.level": "debug",
            "spark.arrowbeat.heartbeat.interval": "200ms",
            "spark.arrowbeat.heartbeat.timeout": "1s",
            "spark.arrowbeat.onHeartbeatTimeout": "kill",
            "spark.arrowbeat.tables.path": str(tmp_path / "tables"),
            "spark.arrowbeat.tables.flushInterval": "200ms",
            "spark.driver.host": "127.0.0.1",
            "spark.app.id": "app-hygiene",
        }
    )
    agents: list[AgentThread] = []
    try:
        assert wait_until(
            lambda: any(line.startswith("ARROWBEAT-READY ") for line in driver.stdout_lines()), 60
        ), driver.stderr_text()
        pid = driver.proc.pid
        for what in ("cmdline", "environ"):
            assert SECRET.encode() not in Path(f"/proc/{pid}/{what}").read_bytes(), what

        healthy = {"7": True, "a b": True, "leaver": True}
        for executor_id in ("7", "a b", "leaver"):
            agent = AgentThread(
                driver.address(),
                SECRET,
                executor_id=executor_id,
                services=HeartbeatServices(interval_s=0.2, timeout_s=1.0),
                is_healthy=functools.partial(healthy.__getitem__, executor_id),
            )
            agent.start()
            agents.append(agent)
            assert agent.wait_registered(30), agent.error
        agents[2].stop(reason="bye\nARROWBEAT-CMD kill-executor 7")
        healthy["7"] = healthy["a b"] = False
        assert wait_until(lambda: "ARROWBEAT-CMD lost-executor 7" in driver.stdout_lines(), 30), (
            driver.stderr_text()
        )
        assert wait_until(lambda: "not asking Spark to kill executor" in driver.stderr_text(), 30)
        assert wait_until(lambda: "executor leaver" in driver.stderr_text(), 30)
    finally:
        for agent in agents:
            agent.stop(timeout_s=1.0)
        try:
            code = driver.stop()
        finally:
            if driver.proc.poll() is None:
                end([psutil.Process(driver.proc.pid)])
    assert code == 0, driver.stderr_text()
    metrics = [line for line in driver.stdout_lines() if line.startswith("ARROWBEAT-METRICS ")]
    assert all(SECRET not in line for line in metrics)  # names and numbers only (plugin_metrics)
    lines = [line for line in driver.stdout_lines() if line not in metrics]
    assert [line.split()[0] for line in lines] == ["ARROWBEAT-READY", "ARROWBEAT-CMD"], lines
    assert lines[1] == "ARROWBEAT-CMD lost-executor 7"
    err = driver.stderr_text()
    assert " DEBUG " in err and SECRET not in err
    left = [line for line in err.splitlines() if "executor leaver" in line and "UNREGISTERED" in line]
    assert left and all(line.endswith("bye\\nARROWBEAT-CMD kill-executor 7") for line in left), left
    assert not any(line.startswith("ARROWBEAT-CMD") for line in err.splitlines()), err
    assert os.path.isdir(tmp_path / "tables" / "executor_events")


def test_the_lifecycle_feed_prints_one_line_per_event_whatever_the_table_holds() -> None:
    import datetime as dt

    from spark_plugin.history.event_lines import format_event

    row = {
        "ts": dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
        "app_id": "app-1",
        "executor_id": "1\n2026-01-01 app-1 executor 2 on h: REGISTERED",
        "host": "h",
        "event": "UNREGISTERED",
        "detail": "bye\nARROWBEAT-CMD kill-executor 1",
    }
    line = format_event(row)
    assert "\n" not in line and line.endswith("(bye\\nARROWBEAT-CMD kill-executor 1)"), line


def test_the_printed_spark_submit_flags_carry_no_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``python -m spark_plugin conf`` goes into spark-submit's argv: no secret there (the driver
    plugin generates one per application)."""
    from spark_plugin.tools.conf_command import main

    jar = tmp_path / "launcher.jar"
    jar.write_bytes(b"")
    monkeypatch.setenv("ARROWBEAT_JARS", str(jar))
    assert main(["conf"]) == 0
    printed = capsys.readouterr().out
    assert "spark.plugins=arrowbeat.ArrowBeatPlugin" in printed
    assert "secret" not in printed.lower()
