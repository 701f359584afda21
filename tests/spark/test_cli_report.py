"""The ``arrowbeat`` console script against a real application (the shared frozen-executor run of
``tests.harness.frozen``: ``hold_app.py`` on local-cluster[2,1,1024], heartbeats every 0.5 s,
timeout 2 s): ``executors`` lists both executors RUNNING, then one executor JVM is frozen (SIGSTOP)
and ``executors`` shows it not RUNNING; after the application ends, ``events`` and ``report`` show
its HEARTBEAT_TIMEOUT from the Delta tables.

The secret reaches spark-submit in a 0600 ``spark-defaults.conf`` (``SPARK_CONF_DIR``) and the
command in ``ARROWBEAT_SECRET``: in no argv."""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
import time
from collections.abc import Generator
from pathlib import Path

import pytest

from harness.procs import wait_until
from spark_plugin.history import locate
from spark_plugin.history.reader import applications
from tests.harness.frozen import INTERVAL_S, TIMEOUT_S, FrozenRun, Phase, Probe

pytestmark = [pytest.mark.spark, pytest.mark.slow]
ARROWBEAT = str(Path(sys.executable).parent / "arrowbeat")
SECRET = "cli-report-test-secret-0123456789"
DETECT_DEADLINE_S = INTERVAL_S + TIMEOUT_S + 10.0
"""A frozen JVM is reported after at most interval + timeout; the margin covers each poll's own
``arrowbeat`` start-up (about a second) on a loaded 2-core machine."""
GENEROUS_S = 60.0


def arrowbeat(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, ARROWBEAT_SECRET=SECRET)
    return subprocess.run([ARROWBEAT, *args], capture_output=True, text=True, env=env, timeout=60)


class ExecutorsCommand:
    """``arrowbeat executors`` run again and again; keeps its last output for failure messages."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.last: subprocess.CompletedProcess[str] | None = None

    def states(self) -> dict[str, str]:
        """Executor id -> state as the table prints them; {} when the call failed (a deadline
        missed on a loaded machine is retried by the caller's wait; the last output is shown)."""
        self.last = arrowbeat("executors", "--rm", self.address)
        if self.last.returncode != 0:
            return {}
        return {line.split()[0]: line.split()[2] for line in self.last.stdout.strip().splitlines()[1:]}

    def __str__(self) -> str:
        last = self.last
        return "never ran" if last is None else f"exit {last.returncode}\n{last.stdout}\n{last.stderr}"


class ExecutorsProbe(Probe):
    """``arrowbeat executors`` polled before, during and after the freeze."""

    def __init__(self) -> None:
        super().__init__()
        self.detected_s = 0.0

    def env(self) -> dict[str, str]:
        conf_dir = self.folder / "spark-conf"
        conf_dir.mkdir()
        defaults = conf_dir / "spark-defaults.conf"
        defaults.write_text(f"spark.arrowbeat.authenticate.secret {SECRET}\n")
        defaults.chmod(0o600)
        return {"SPARK_CONF_DIR": str(conf_dir)}

    def watch(self, run: FrozenRun) -> Generator[Phase, None, None]:
        app = run.app
        command = ExecutorsCommand(run.ready["rm_address"])
        both_running = lambda: list(command.states().values()) == ["RUNNING", "RUNNING"]  # noqa: E731
        assert wait_until(both_running, GENEROUS_S), f"{command}\n{app.log_tail()}"

        yield Phase.FROZEN
        reported = lambda: command.states().get(run.frozen) not in ("RUNNING", None)  # noqa: E731
        assert wait_until(reported, DETECT_DEADLINE_S), f"{command}\n{app.log_tail()}"
        self.detected_s = time.monotonic() - run.stopped_at

        yield Phase.THAWED
        back = lambda: command.states().get(run.frozen) == "RUNNING"  # noqa: E731
        assert wait_until(back, GENEROUS_S), f"{command}\n{app.log_tail()}"


EXECUTORS = ExecutorsProbe()
FROZEN_PROBES = (EXECUTORS,)


def test_executors_events_and_report_of_a_frozen_executor(frozen_run: FrozenRun, tmp_path: Path) -> None:
    EXECUTORS.verdict()
    assert frozen_run.result, "the application ran its last job"
    assert frozen_run.exit_code == 0
    tables, victim = frozen_run.tables, frozen_run.frozen

    [(app_id, _)] = applications(locate(tables))
    events = arrowbeat("events", "--tables", str(tables), "--app", app_id)
    assert events.returncode == 0, events.stderr
    assert re.search(rf"executor {victim} on \S+: HEARTBEAT_TIMEOUT", events.stdout), events.stdout
    assert re.search(rf"executor {victim} on \S+: REREGISTERED", events.stdout), events.stdout

    output = tmp_path / "report.html"
    report = arrowbeat(
        "report", "--tables", str(tables), "--app", app_id, "-o", str(output), "--timeout", "2"
    )
    assert report.returncode == 0, report.stderr
    document = output.read_text()
    plotted = re.findall(r'<img class="executor-plot" data-executor="([^"]+)"[^>]*base64,([^"]+)"', document)
    assert {eid for eid, _ in plotted} >= {"0", "1"}, "a plot per executor"
    assert all(base64.b64decode(png).startswith(b"\x89PNG") for _, png in plotted)
    start = document.index(f'id="executor-{victim}"')
    end = min(i for i in (document.find("<h3", start), document.find("<h2", start)) if i != -1)
    assert "HEARTBEAT_TIMEOUT" in document[start:end], "the frozen executor's section marks its timeout"
    assert not re.search(r"https?://", document)
    print(f"arrowbeat executors showed the frozen executor after {EXECUTORS.detected_s:.1f} s")
