"""Every reader of the history tables exits with its own status (issue 24, item 6).

A short read with delta-rs that leaves its Arrow table alive at exit aborted the interpreter's
finalisation in about 1 run of 4 here (exit 134, "terminate called without an active
exception"), after the work was done. ``history.reader.run_reader`` ends such a process without
finalisation; the CLI, the benchmarks and the demo job end through it. Each read runs in its own
interpreter, several times, since the abort is a race."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

RUNS = 8
ROWS = 500
READER = textwrap.dedent(
    """
    import sys

    from deltalake import DeltaTable

    from spark_plugin.history.reader import run_reader

    KEPT = []  # alive until the end, as a benchmark's or a job's rows are: what tripped the exit


    def main() -> int:
        table = DeltaTable(sys.argv[1]).to_pyarrow_table()
        KEPT.append(table)
        print(f"rows={table.num_rows}")  # block-buffered on a pipe: the helper must flush it
        if sys.argv[2] == "raise":
            raise RuntimeError("the reader failed")
        return int(sys.argv[2])


    run_reader(main)
    """
)


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import pyarrow as pa
    from deltalake import write_deltalake

    path = tmp_path_factory.mktemp("history") / "executor_events"
    for start in range(0, ROWS, 100):  # several files, as the flusher's commits leave them
        write_deltalake(str(path), pa.table({"seq": list(range(start, start + 100))}), mode="append")
    return path


def _read(table: Path, outcome: str, runs: int) -> list[subprocess.CompletedProcess[str]]:
    """``runs`` reader processes, two at a time (the machine's cores)."""
    done: list[subprocess.CompletedProcess[str]] = []
    for first in range(0, runs, 2):
        batch = [
            subprocess.Popen(
                [sys.executable, "-c", READER, str(table), outcome],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(min(2, runs - first))
        ]
        for proc in batch:
            out, err = proc.communicate(timeout=120)
            done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return done


def test_a_short_read_exits_0_every_time(table: Path) -> None:
    results = _read(table, "0", RUNS)
    assert [r.returncode for r in results] == [0] * RUNS, [r.stderr[-300:] for r in results]
    assert all(r.stdout == f"rows={ROWS}\n" for r in results)
    assert not any("terminate called" in r.stderr for r in results)


def test_the_status_is_mains_own(table: Path) -> None:
    [returned] = _read(table, "3", 1)
    assert (returned.returncode, returned.stdout) == (3, f"rows={ROWS}\n")
    [raised] = _read(table, "raise", 1)
    assert raised.returncode == 1 and raised.stdout == f"rows={ROWS}\n"
    assert "RuntimeError: the reader failed" in raised.stderr
