"""The slow executor named, on real Spark (issue 37, item 3; done-when 2 and 3).

A spark-submit application (``apps/degraded_app.py``) on local-cluster[2,1,1024], heartbeats every
0.5 s with a 2 s timeout, keeps both executors busy with skewed jobs (one partition eight times the
others' Python work; a hot key sending most rows of an aggregation to one reduce task). For the
first 35 s nothing is disturbed: the tables must record no ``DEGRADED`` at all. Then the test slows
one executor JVM with a duty cycle (SIGSTOP 150 ms of every 300 ms, ``harness.duty_cycle``) while
the jobs go on: it must be recorded ``DEGRADED`` within 30 s of the cycle's start, with its
evidence, and the healthy one never; once the cycle ends it is recorded ``RECOVERED``.

With ``spark.arrowbeat.onDegraded=exclude`` the slowed executor is replaced while the jobs run
(Spark kills it and starts another) and every job still completes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from harness.history_read import rows
from harness.procs import executor_jvms, wait_until
from harness.submit import SubmittedApp
from spark_plugin.monitoring.driver_degraded import LEAVE_S, WINDOW_S
from tests.harness.duty_cycle import DutyCycle
from tests.harness.frozen import fast_heartbeats

pytestmark = pytest.mark.spark
APP = Path(__file__).parent / "apps" / "degraded_app.py"
DEGRADED_WITHIN_S = 30.0
FLUSH_SLACK_S = 5.0
"""The tables are committed every 0.5 s; a loaded machine commits later."""
GRAY = ("DEGRADED", "RECOVERED")


def gray_rows(tables: Path) -> list[dict[str, Any]]:
    return [r for r in rows(tables, "executor_events") if r["event"] in GRAY]


def test_a_duty_cycled_executor_is_degraded_within_30s_the_healthy_one_never_and_skew_records_nothing(
    scratch: Path,
) -> None:
    folder = scratch / f"degraded-{time.time_ns()}"
    folder.mkdir()
    tables, stop = folder / "tables", folder / "stop"
    app = SubmittedApp(APP, "local-cluster[2,1,1024]", scratch, fast_heartbeats(tables), args=[str(stop)])
    cycle: DutyCycle | None = None
    try:
        app.wait_for("APP-READY ", timeout_s=180)
        jvms = executor_jvms(app.marker)
        assert len(jvms) == 2, jvms
        skewed = app.wait_for("SKEWED-DONE ", timeout_s=240)
        assert skewed["jobs"] >= 2 and skewed["seconds"] >= 35.0, skewed  # the app's default --skewed-s
        assert gray_rows(tables) == [], "a skewed but healthy run was named slow"

        victim, healthy = sorted(jvms)
        cycle = DutyCycle(jvms[victim].pid, stop_s=0.15, period_s=0.3).start()
        named = wait_until(
            lambda: any(r["event"] == "DEGRADED" for r in gray_rows(tables)),
            DEGRADED_WITHIN_S + FLUSH_SLACK_S,
        )
        cycle.stop()
        ended_at = time.time()
        started_at = cycle.started_at
        assert started_at is not None
        found = gray_rows(tables)
        assert named, f"no DEGRADED within {DEGRADED_WITHIN_S + FLUSH_SLACK_S:g} s of the cycle: {found}"
        first = found[0]
        assert (first["executor_id"], first["event"]) == (victim, "DEGRADED"), found
        took = first["ts"].timestamp() - started_at
        print(f"DEGRADED {took:.1f} s after the duty cycle began ({cycle.cycles} cycles)")
        assert took <= DEGRADED_WITHIN_S, f"DEGRADED {took:.1f} s after the cycle began"
        assert first["detail"].startswith("slower than its peers: JVM pulse lateness"), first["detail"]
        assert "vs the peers'" in first["detail"] and " since " in first["detail"]

        back = wait_until(
            lambda: any(r["event"] == "RECOVERED" for r in gray_rows(tables)),
            LEAVE_S + WINDOW_S + 20.0,
        )
        assert back, f"no RECOVERED after the cycle ended at {ended_at}: {gray_rows(tables)}"
        stop.touch()
        app.wait_for("APP-DONE ", timeout_s=180)
    finally:
        if cycle is not None:
            cycle.stop()
        app.close()
    found = gray_rows(tables)
    assert [(r["executor_id"], r["event"]) for r in found] == [(victim, "DEGRADED"), (victim, "RECOVERED")], (
        found
    )
    assert healthy not in {r["executor_id"] for r in found}


def test_with_exclude_the_slowed_executor_is_replaced_and_the_jobs_go_on(scratch: Path) -> None:
    """Killed and replaced: Spark's default, without decommissioning. With
    ``spark.decommission.enabled`` the JVM decommissions it instead (no new task there, it exits
    once its tasks are done); that choice is tested without Spark (``test_degraded``'s
    ``exclude_action`` case, the launcher's ``DriverCommandsTest``), and the Spark internal it
    calls is checked on every supported Spark (``test_launcher_compat``'s shim probe), not by a
    second application here (a minute of ``make test``)."""
    folder = scratch / f"degraded-exclude-{time.time_ns()}"
    folder.mkdir()
    tables, stop = folder / "tables", folder / "stop"
    conf = {
        **fast_heartbeats(tables),
        "spark.arrowbeat.onDegraded": "exclude",
        "spark.decommission.enabled": "false",
    }
    app = SubmittedApp(APP, "local-cluster[2,1,1024]", scratch, conf, args=[str(stop), "--skewed-s", "3"])
    cycle: DutyCycle | None = None
    try:
        app.wait_for("APP-READY ", timeout_s=180)
        jvms = executor_jvms(app.marker)
        assert len(jvms) == 2, jvms
        app.wait_for("SKEWED-DONE ", timeout_s=120)
        victim = sorted(jvms)[0]
        cycle = DutyCycle(jvms[victim].pid, stop_s=0.15, period_s=0.3).start()

        def removed() -> bool:
            return any(
                r["executor_id"] == victim and r["event"] in ("SPARK_REMOVED", "SPARK_LOST")
                for r in rows(tables, "executor_events")
            )

        assert wait_until(removed, DEGRADED_WITHIN_S + 30.0), rows(tables, "executor_events")
        cycle.stop()
        started_at = cycle.started_at
        replaced = wait_until(lambda: len(set(executor_jvms(app.marker)) - {victim}) >= 2, 120)
        stop.touch()
        done = app.wait_for("APP-DONE ", timeout_s=180)
    finally:
        if cycle is not None:
            cycle.stop()
        app.close()
    found = [(r["executor_id"], r["event"], r["ts"].timestamp()) for r in rows(tables, "executor_events")]
    degraded = [t for e, kind, t in found if (e, kind) == (victim, "DEGRADED")]
    gone = [t for e, kind, t in found if e == victim and kind in ("SPARK_REMOVED", "SPARK_LOST")]
    assert degraded and gone and started_at is not None, found
    print(
        f"kill: DEGRADED {degraded[0] - started_at:.1f} s, "
        f"removed {gone[0] - started_at:.1f} s after the duty cycle began"
    )
    assert replaced, "Spark started no replacement executor"
    assert done["jobs"] >= 1
