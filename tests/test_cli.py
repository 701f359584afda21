"""The ``arrowbeat`` command without Spark: arguments, where the secret may come from, ``executors``
against a real in-process RM over gRPC (plain and TLS, right and wrong secret, nobody listening),
``events`` (``--follow`` as a subprocess ended by SIGTERM), ``tables`` and ``report`` on history
tables written by the real ``HistoryWriter``."""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from harness.procs import wait_until
from heartbeat import AgentThread, HeartbeatServices, ResourceManagerServer, RetryPolicy
from spark_plugin.history import HistoryWriter
from spark_plugin.history.shuffle_metrics import append_rows
from spark_plugin.settings import tls
from spark_plugin.tools import cli
from spark_plugin.tools.conf_command import main as module_main

pytestmark = pytest.mark.timeout(120)

SECRET = "cli-test-secret"
RETRY = RetryPolicy(min_delay_s=0.02, max_delay_s=0.1, deadline_s=5.0, attempt_timeout_s=1.0)
APP, OTHER_APP = "app-20261123120000-0007", "app-20261123110000-0006"
T0 = dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.UTC)
DEADLINE_S = 30.0
STEADY = HeartbeatServices(interval_s=0.1, timeout_s=DEADLINE_S, rpc_failure_threshold=2)
"""Heartbeats every 0.1 s, so listings show ages at once, and a timeout no loaded machine reaches:
the tests assert both agents RUNNING (a 0.5 s timeout let one time out with both cores busy)."""


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


# --- arguments and the secret ----------------------------------------------------------------------


@pytest.mark.parametrize("given", [["--secret", SECRET], [f"--secret={SECRET}"], ["--sec", SECRET]])
def test_the_secret_is_never_an_argument(given: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["executors", "--rm", "127.0.0.1:1", *given], capsys)
    assert code == 2 and out == ""
    assert "never taken from the command line" in err and "ARROWBEAT_SECRET" in err
    assert SECRET not in err


@pytest.mark.parametrize(
    "argv",
    [
        ["executors"],  # --rm is required
        ["events"],  # --tables is required
        ["report", "--tables", "t", "-o", "r.html"],  # --app is required
        ["tables", "shrink", "--tables", "t"],
        ["executors", "--rm", "h:1", "--watch", "0"],
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2


def test_a_malformed_rm_address_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ARROWBEAT_SECRET", SECRET)
    code, _, err = run(["executors", "--rm", "no-port-here"], capsys)
    assert code == 2 and "expected HOST:PORT" in err


def test_no_secret_says_where_to_put_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ARROWBEAT_SECRET", raising=False)
    code, _, err = run(["executors", "--rm", "127.0.0.1:1"], capsys)
    assert code == 2 and "ARROWBEAT_SECRET" in err and "--secret-file" in err
    assert "Traceback" not in err


def test_a_secret_file_others_can_read_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ARROWBEAT_SECRET", raising=False)
    path = tmp_path / "secret"
    path.write_text(SECRET + "\n")
    path.chmod(0o640)
    code, _, err = run(["executors", "--rm", "127.0.0.1:1", "--secret-file", str(path)], capsys)
    assert code == 2 and "readable by no one else" in err and "chmod 600" in err
    assert SECRET not in err


def test_conf_prints_what_python_m_spark_plugin_conf_prints(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["conf"], ["conf", "--no-delta"]):
        expected_code = module_main(argv)
        expected = capsys.readouterr()
        code, out, err = run(argv, capsys)
        assert (code, out, err) == (expected_code, expected.out, expected.err)


# --- executors against a real RM -------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def material() -> tls.TlsMaterial:
    return tls.generate_self_signed()


def running_rm(material: tls.TlsMaterial | None) -> Iterator[str]:
    """An RM with two registered agents (executors 0 and 1); yields its address."""
    credentials = None if material is None else tls.grpc_server_credentials(material)
    server = ResourceManagerServer(STEADY, SECRET, server_credentials=credentials)
    address = server.start()
    client: dict[str, object] = {}
    if material is not None:
        client = {
            "channel_credentials": tls.grpc_channel_credentials(material),
            "channel_options": tls.grpc_channel_options(material),
        }
    agents = [
        AgentThread(address, SECRET, eid, services=STEADY, retry_policy=RETRY, **client)  # type: ignore[arg-type]
        for eid in ("1", "0")
    ]
    try:
        for a in agents:
            a.start()
        assert all(a.wait_registered(DEADLINE_S) for a in agents)
        yield address
    finally:
        for a in agents:
            a.stop()
        server.stop(grace_s=0.2)


@pytest.fixture
def rm() -> Iterator[str]:
    yield from running_rm(None)


@pytest.fixture
def tls_rm(material: tls.TlsMaterial) -> Iterator[str]:
    yield from running_rm(material)


def table_states(out: str) -> dict[str, str]:
    lines = out.strip().splitlines()
    assert lines[0].split()[:3] == ["EXECUTOR", "HOST", "STATE"], out
    return {line.split()[0]: line.split()[2] for line in lines[1:]}


def test_executors_lists_the_rms_view(
    rm: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ARROWBEAT_SECRET", SECRET)
    code, out, err = run(["executors", "--rm", rm], capsys)
    assert code == 0, err
    assert table_states(out) == {"0": "RUNNING", "1": "RUNNING"}
    assert list(table_states(out)) == ["0", "1"]  # in executor order


def test_executors_json_and_a_private_secret_file(
    rm: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ARROWBEAT_SECRET", raising=False)
    path = tmp_path / "secret"
    path.write_text(SECRET + "\n")
    path.chmod(0o600)
    # Heartbeats every 0.1 s: one has been answered by the time both agents are listed with an age.
    assert wait_until(
        lambda: (
            cli.main(["executors", "--rm", rm, "--secret-file", str(path), "--json"]) == 0
            and all(r["heartbeat_age_s"] is not None for r in json.loads(capsys.readouterr().out))
        ),
        DEADLINE_S,
    )
    code, out, _ = run(["executors", "--rm", rm, "--secret-file", str(path), "--json"], capsys)
    rows = json.loads(out)
    assert code == 0 and [r["executor_id"] for r in rows] == ["0", "1"]
    assert all(r["state"] == "RUNNING" and r["rtt_ms"] is not None and r["pid"] for r in rows), rows


def test_a_wrong_secret_is_one_clear_line(
    rm: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ARROWBEAT_SECRET", "not-the-secret")
    code, out, err = run(["executors", "--rm", rm], capsys)
    assert code == 1 and out == ""
    assert "refused the secret" in err and "Traceback" not in err and "not-the-secret" not in err


def test_nobody_listening_fails_within_the_deadline(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ARROWBEAT_SECRET", SECRET)
    address = f"127.0.0.1:{free_port()}"
    code, _, err = run(["executors", "--rm", address, "--timeout", "2"], capsys)
    assert code == 1 and f"no answer from an RM at {address} within 2 s" in err
    assert "--ca-file" in err and "Traceback" not in err


def test_a_tls_rm_needs_its_certificate(
    tls_rm: str,
    material: tls.TlsMaterial,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ARROWBEAT_SECRET", SECRET)
    code, _, err = run(["executors", "--rm", tls_rm, "--timeout", "3"], capsys)
    assert code == 1 and "answers only over TLS: pass --ca-file" in err

    pem = tmp_path / "rm.pem"
    pem.write_bytes(material.cert_chain_pem)
    one_line = tmp_path / "generated-cert"  # the SparkConf's spark.arrowbeat.ssl.generatedCert value
    one_line.write_text(tls.internal_settings(material)[tls.GENERATED_CERT_KEY] + "\n")
    for ca_file in (pem, one_line):
        monkeypatch.setenv("ARROWBEAT_SECRET", SECRET)  # read_secret takes it out of the environment
        code, out, err = run(["executors", "--rm", tls_rm, "--ca-file", str(ca_file)], capsys)
        assert code == 0, err
        assert table_states(out) == {"0": "RUNNING", "1": "RUNNING"}

    other = tmp_path / "other.pem"
    other.write_bytes(tls.generate_self_signed().cert_chain_pem)
    monkeypatch.setenv("ARROWBEAT_SECRET", SECRET)
    code, _, err = run(["executors", "--rm", tls_rm, "--ca-file", str(other), "--timeout", "3"], capsys)
    assert code == 1 and "check that --ca-file holds the RM's certificate" in err

    junk = tmp_path / "junk"
    junk.write_text("not a certificate")
    monkeypatch.setenv("ARROWBEAT_SECRET", SECRET)
    code, _, err = run(["executors", "--rm", tls_rm, "--ca-file", str(junk)], capsys)
    assert code == 2 and "holds no PEM certificate" in err


def test_watch_refreshes_until_sigterm(rm: str) -> None:
    """``--watch`` in a subprocess: it prints refreshed tables and exits 0 on SIGTERM."""
    env = dict(os.environ, ARROWBEAT_SECRET=SECRET)
    with subprocess.Popen(
        [sys.executable, "-m", "spark_plugin.tools.cli", "executors", "--rm", rm, "--watch", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    ) as proc:
        lines = Lines(proc)
        try:
            assert lines.wait_for(lambda seen: sum(line.startswith("-- ") for line in seen) >= 2, DEADLINE_S)
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=DEADLINE_S)
        assert code == 0, proc.stderr.read() if proc.stderr else ""
    assert sum(1 for line in lines.seen if re.match(r"^[01]\s+127\.0\.0\.1\s+RUNNING", line)) >= 4


class Lines:
    """A subprocess's stdout lines, read on a thread; a test waits for a condition over them."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.seen: list[str] = []
        self._cond = threading.Condition()
        assert proc.stdout is not None
        stream = proc.stdout
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            with self._cond:
                self.seen.append(line.rstrip("\n"))
                self._cond.notify_all()

    def wait_for(self, condition: Callable[[list[str]], bool], timeout_s: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: condition(list(self.seen)), timeout_s)


# --- history tables: events, tables, report --------------------------------------------------------


def event(
    app: str, eid: str, instance: str, seconds: float, kind: str, detail: str | None = None
) -> dict[str, Any]:
    return {
        "app_id": app,
        "executor_id": eid,
        "host": f"10.0.0.{eid}",
        "instance_id": instance,
        "ts": T0 + dt.timedelta(seconds=seconds),
        "event": kind,
        "detail": detail,
    }


def beat(app: str, eid: str, instance: str, seconds: float, rtt_ms: float) -> dict[str, Any]:
    return {
        "app_id": app,
        "executor_id": eid,
        "host": f"10.0.0.{eid}",
        "instance_id": instance,
        "ts": T0 + dt.timedelta(seconds=seconds),
        "rtt_ms": rtt_ms,
        "gap_ms": None,
        "jvm_pulse_age_ms": 20,
        "slots_total": 1,
        "slots_busy": 0,
        "running_tasks": 0,
        "rss_bytes": 200 << 20,
    }


@pytest.fixture
def tables(tmp_path: Path) -> Path:
    """Two applications' history: in ``APP`` (the later one) executor 0 is silent from 9.5 s to
    20 s (HEARTBEAT_TIMEOUT at 12 s, REREGISTERED as a new instance at 20 s), executor 1 runs on
    and leaves; one Arrow shuffle. Each part is its own commit, so there are files to compact."""
    root = tmp_path / "tables"
    writer = HistoryWriter(root, flush_interval_s=1.0)
    writer.open()
    writer.append("executor_events", event(OTHER_APP, "0", "z0", -3600, "REGISTERED"))
    writer.append("heartbeats", beat(OTHER_APP, "0", "z0", -3599, 1.0))
    writer.flush()
    writer.append("executor_events", event(APP, "0", "a0", 0.0, "REGISTERED"))
    writer.append("executor_events", event(APP, "1", "a1", 0.1, "REGISTERED"))
    for i in range(60):
        s = i * 0.5
        if not 9.5 < s < 20:
            writer.append("heartbeats", beat(APP, "0", "a0" if s < 10 else "b0", s, 1.0 + (i % 3)))
        writer.append("heartbeats", beat(APP, "1", "a1", s + 0.1, 0.7))
        if i % 20 == 19:
            writer.flush()
    writer.append("executor_events", event(APP, "0", "a0", 12.0, "HEARTBEAT_TIMEOUT", "no heartbeat for 2 s"))
    writer.append("executor_events", event(APP, "0", "b0", 20.0, "REREGISTERED"))
    writer.append("executor_events", event(APP, "1", "a1", 30.0, "UNREGISTERED", "<script>x</script>"))
    writer.flush()
    reports = [
        {
            "side": side,
            "partition": p,
            "attempt": "0",
            "executor": "1",
            "bytes": 1 << 20,
            "batches": 1,
            "rows": 500,
            "spill_bytes": 0,
            "blocked_s": 0.0,
            "seconds": 0.1,
            "recomputed": False,
        }
        for side in ("write", "read")
        for p in range(3)
    ]
    append_rows(root, APP, 3, reports)
    return root


def test_events_prints_one_line_per_event_of_one_app(
    tables: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(["events", "--tables", str(tables), "--app", APP], capsys)
    lines = out.strip().splitlines()
    assert code == 0 and len(lines) == 5
    assert "executor 0 on 10.0.0.0: HEARTBEAT_TIMEOUT (no heartbeat for 2 s)" in lines[2]
    assert lines[3].endswith("REREGISTERED")
    code, out, _ = run(["events", "--tables", str(tables)], capsys)
    assert code == 0 and len(out.strip().splitlines()) == 6 and OTHER_APP in out.splitlines()[0]


def test_degraded_lists_the_executors_slower_than_their_peers_now(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "gray"
    writer = HistoryWriter(root, flush_interval_s=1.0)
    writer.open()
    evidence = "slower than its peers: JVM pulse lateness 49.5 ms vs the peers' 0.50 ms (99.0x, 1 peer)"
    writer.append("executor_events", event(APP, "0", "a0", 0.0, "REGISTERED"))
    writer.append("executor_events", event(APP, "1", "a1", 0.1, "REGISTERED"))
    writer.flush()
    code, out, _ = run(["degraded", "--tables", str(root)], capsys)
    assert code == 0 and out.strip() == f"no executor of {APP} is degraded (slower than its peers)"
    writer.append("executor_events", event(APP, "0", "a0", 5.0, "DEGRADED", evidence))
    writer.append("executor_events", event(APP, "1", "a1", 6.0, "DEGRADED", evidence))
    writer.append("executor_events", event(APP, "1", "a1", 30.0, "RECOVERED", "back in line"))
    writer.flush()
    code, out, _ = run(["degraded", "--tables", str(root), "--app", APP], capsys)
    lines = out.strip().splitlines()
    assert code == 0 and len(lines) == 1, lines
    assert "executor 0 " in lines[0] and "DEGRADED" in lines[0] and "49.5 ms" in lines[0]
    writer.append("executor_events", event(APP, "0", "a0", 40.0, "SPARK_REMOVED", "replaced"))
    writer.flush()
    code, out, _ = run(["degraded", "--tables", str(root)], capsys)
    assert code == 0 and "no executor" in out
    writer.stop()


def test_an_unknown_app_or_a_missing_table_is_one_clear_line(
    tables: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(["events", "--tables", str(tables), "--app", "app-nope"], capsys)
    assert code == 1 and "no application 'app-nope'" in err and APP in err and OTHER_APP in err
    code, _, err = run(["report", "--tables", str(tables), "--app", "app-nope", "-o", "x.html"], capsys)
    assert code == 1 and "no application 'app-nope'" in err
    for argv in (["events"], ["tables", "describe"], ["report", "--app", "latest", "-o", "x.html"]):
        code, _, err = run([*argv, "--tables", str(tmp_path / "nothing")], capsys)
        assert code == 1 and "no Delta table" in err and "spark.arrowbeat.tables.path" in err, argv
        assert "Traceback" not in err


def test_events_follow_prints_new_rows_and_ends_on_sigterm(tables: Path) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "spark_plugin.tools.cli",
            "events",
            "--tables",
            str(tables),
            "--app",
            "latest",
            "--follow",
            "--interval",
            "0.1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = Lines(proc)
        assert lines.wait_for(lambda seen: len(seen) == 5, DEADLINE_S), lines.seen
        writer = HistoryWriter(tables, flush_interval_s=1.0)
        writer.open()
        writer.append("executor_events", event(APP, "2", "c2", 40.0, "REGISTERED"))
        writer.append("executor_events", event(OTHER_APP, "9", "c9", 40.0, "REGISTERED"))  # not followed
        writer.flush()
        writer.maintain()  # compaction rewrites old rows into new files: none may print again
        writer.append("executor_events", event(APP, "2", "c2", 41.0, "UNREACHABLE", "2 failed requests"))
        writer.flush()
        assert lines.wait_for(lambda seen: any("UNREACHABLE" in line for line in seen), DEADLINE_S), (
            lines.seen
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=DEADLINE_S)
        stderr = proc.stderr.read() if proc.stderr else ""
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    assert code == 0 and "Traceback" not in stderr, stderr
    assert len(lines.seen) == 7 and "executor 2 on 10.0.0.2: REGISTERED" in lines.seen[5], lines.seen
    assert not any("executor 9" in line for line in lines.seen)


def test_tables_describe_compact_and_vacuum(tables: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["tables", "describe", "--tables", str(tables)], capsys)
    assert code == 0
    assert re.search(r"executor_events: .*\n  version \d+, \d+ files, .*, 6 rows, 2 applications", out), out
    assert "heartbeats:" in out and "shuffle_metrics:" in out
    compacting = re.search(r"heartbeats: compacting (\d+) files", run_out(tables, "compact", capsys))
    assert compacting and int(compacting[1]) > 1
    code, out, _ = run(["tables", "describe", "--tables", str(tables)], capsys)
    assert re.search(r"heartbeats: .*\n  version \d+, 1 files, .*, 101 rows", out), out
    code, out, _ = run(["tables", "vacuum", "--tables", str(tables), "--dry-run"], capsys)
    assert code == 0 and "heartbeats: would remove 0 files" in out  # within the retention: kept


def run_out(tables: Path, action: str, capsys: pytest.CaptureFixture[str]) -> str:
    code, out, err = run(["tables", action, "--tables", str(tables)], capsys)
    assert code == 0, err
    return out


def pngs(document: str) -> dict[str, bytes]:
    """Each embedded plot's PNG by its ``data-executor`` (or class for the others)."""
    found = {}
    for tag in re.findall(r"<img [^>]*>", document):
        src = re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', tag)
        assert src, tag
        key = re.search(r'data-executor="([^"]*)"', tag) or re.search(r'class="([^"]*)"', tag)
        assert key
        found[key[1]] = base64.b64decode(src[1])
    return found


def test_report_marks_the_timeout_the_gap_and_the_reregistration(
    tables: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "out" / "report.html"
    code, out, err = run(
        ["report", "--tables", str(tables), "--app", "latest", "-o", str(output), "--timeout", "2"], capsys
    )
    assert code == 0, err
    assert str(output) in out and APP in out
    document = output.read_text()
    images = pngs(document)
    assert {"0", "1", "timeline", "shuffle-plot"} <= set(images)
    assert all(png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 2000 for png in images.values())
    assert not re.search(r"(?i)https?:|//[a-z0-9]", re.sub(r"data:image/png;base64,[^\"]+", "", document))
    assert "<script>" not in document and "&lt;script&gt;x&lt;/script&gt;" in document
    # The summary row of executor 0: two instances, the 10.5 s gap over the timeout, one of each event.
    row0 = re.search(r'<tr><td class="text">0</td>.*?</tr>', document)
    assert row0
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row0[0])
    assert cells[2] == "2" and "10.50" in cells[9] and 'class="bad"' in cells[9]
    assert cells[11:14] == ["1", "0", "1"] and "REREGISTERED" in cells[14]
    section = document[document.index('id="executor-0"') : document.index('id="executor-1"')]
    assert "HEARTBEAT_TIMEOUT" in section and "REREGISTERED" in section
    assert ">3</td><td>3</td>" in document or "<td>3</td>" in document  # shuffle 3 listed
    assert OTHER_APP not in document


def test_report_of_one_app_by_id(tables: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "other.html"
    code, _, err = run(["report", "--tables", str(tables), "--app", OTHER_APP, "-o", str(output)], capsys)
    assert code == 0, err
    document = output.read_text()
    assert set(pngs(document)) == {"0", "timeline"}
    assert "No Arrow shuffle recorded" in document and APP not in document
