"""Soak: a fault-free application watched by arrowbeat for N minutes (default 10).

Interval 1 s, timeout 5 s (the defaults), a light job every ~0.1 s on local-cluster[2,1,1024].
Counts false alarms (any HEARTBEAT_TIMEOUT / UNREACHABLE / REREGISTERED / UNREGISTERED before the
application ends), heartbeats recorded per executor, and the file count of each history table
(data files and log files), which compaction, checkpoints and vacuum keep bounded: the count
grows for one retention period (``--retention``, 2 minutes here so that a 10-minute run shows it;
the default setting is 1 hour) and then stays flat, which the ``*_files_growth_last_half``
figures show (files at the end minus files at half time).

    .venv/bin/python -m benchmarks.soak_monitoring --minutes 10   (or: make bench BENCH=soak_monitoring)
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from harness.apps import HOLD_APP
from harness.env import prepare
from harness.history_read import rows
from harness.procs import end, ours
from harness.submit import SubmittedApp

ALARMS = {"HEARTBEAT_TIMEOUT", "UNREACHABLE", "REREGISTERED", "UNREGISTERED"}


def file_counts(table: Path) -> tuple[int, int]:
    data = sum(1 for p in table.glob("*.parquet"))
    log = sum(1 for p in (table / "_delta_log").iterdir() if p.is_file())
    return data, log


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--retention", default="2min", help="spark.arrowbeat.tables.retention")
    args = parser.parse_args()
    prepare()  # loopback, the venv's Python everywhere, the run marker
    scratch = Path(tempfile.mkdtemp(prefix="arrowbeat-soak-"))
    tables = scratch / "tables"
    go = scratch / "go"
    app = SubmittedApp(
        HOLD_APP,
        "local-cluster[2,1,1024]",
        scratch,
        conf={
            "spark.arrowbeat.tables.path": str(tables),
            "spark.arrowbeat.tables.compactInterval": "1min",
            "spark.arrowbeat.tables.retention": args.retention,
        },
        args=[str(go), "--busy", "--max-wait", str(args.minutes * 60 + 120)],
    )
    try:
        app.wait_for("APP-READY ", timeout_s=180)
        start = time.time()
        peak = {"heartbeats": (0, 0), "executor_events": (0, 0)}
        at_half: dict[str, int] = {}
        while time.time() - start < args.minutes * 60:
            time.sleep(15)
            now = {name: file_counts(tables / name) for name in peak}
            for name, counts in now.items():
                peak[name] = (max(peak[name][0], counts[0]), max(peak[name][1], counts[1]))
                if not at_half and time.time() - start >= args.minutes * 30:
                    at_half = {n: sum(c) for n, c in now.items()}
            print(f"{(time.time() - start) / 60:5.1f} min: (data, log) files now {now}", flush=True)
        go.touch()
        app.wait_for("APP-RESULT ", timeout_s=180)
        app.wait(timeout_s=120)
        events = rows(tables, "executor_events")
        alarms = [
            e for e in events if e["event"] in ALARMS and e["ts"].timestamp() < start + args.minutes * 60
        ]
        beats = rows(tables, "heartbeats")
        per_executor = {
            e: sum(1 for b in beats if b["executor_id"] == e) for e in {b["executor_id"] for b in beats}
        }
        for name in peak:
            data, log = file_counts(tables / name)
            print(f"RESULT {name}_files_end={data + log}")
            print(f"RESULT {name}_files_peak={peak[name][0] + peak[name][1]}")
            print(f"RESULT {name}_files_growth_last_half={data + log - at_half.get(name, 0)}")
        print(f"heartbeats per executor: {per_executor}; alarms: {alarms}")
        print(f"RESULT soak_minutes={args.minutes:g}")
        print(f"RESULT heartbeats_recorded={len(beats)}")
        print(f"RESULT false_timeouts={len(alarms)}")
        return 0 if not alarms else 1
    finally:
        app.close()
        end(ours(app=app.marker))


if __name__ == "__main__":
    from spark_plugin.history.reader import run_reader

    run_reader(main)  # no interpreter finalisation: delta-rs's readers can abort it (exit 134)
