"""The chaos soak's own arithmetic (``benchmarks/chaos.py``), without Spark: the expected output
of a rate micro-batch, the sink comparison that gives ``lost_rows``, and which fault a timeout is
blamed on. The soak itself runs in ``tests/spark/test_chaos.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from harness.chaos import KEYS, Fault, check_sink, expected_batch


def brute(start: int, stop: int) -> dict[int, tuple[int, int]]:
    out: dict[int, tuple[int, int]] = {}
    for v in range(start, stop):
        n, s = out.get(v % KEYS, (0, 0))
        out[v % KEYS] = (n + 1, s + v)
    return out


@pytest.mark.parametrize(
    ("start", "stop"), [(0, 0), (0, 1), (0, 2000), (3, 5), (17, 18), (2000, 4000), (5, 100)]
)
def test_expected_batch_is_the_sum_per_key(start: int, stop: int) -> None:
    assert expected_batch(start, stop) == brute(start, stop)


def write_run(
    root: Path, batches: dict[int, list[tuple[int, int, int]]], ends: list[int]
) -> tuple[Path, Path]:
    """A sink with ``batches`` (batch id -> (k, n, sv) rows) and a checkpoint whose offsets log
    ends batch ``i`` at ``ends[i]``."""
    from deltalake import write_deltalake

    sink, checkpoint = root / "sink", root / "checkpoint"
    (checkpoint / "offsets").mkdir(parents=True)
    for batch, end in enumerate(ends):
        (checkpoint / "offsets" / str(batch)).write_text(
            "v1\n" + json.dumps({"batchWatermarkMs": 0}) + "\n" + json.dumps({"offset": end, "timestamp": 0})
        )
    flat = [(b, k, n, s) for b, found in batches.items() for k, n, s in found]
    table = pa.table(
        {
            name: pa.array([r[i] for r in flat], pa.int64())
            for i, name in enumerate(["batch_id", "k", "n", "sv"])
        }
    )
    write_deltalake(str(sink), table)
    return sink, checkpoint


def rows_of(start: int, stop: int) -> list[tuple[int, int, int]]:
    return [(k, n, s) for k, (n, s) in expected_batch(start, stop).items()]


def test_an_exact_sink_loses_nothing(tmp_path: Path) -> None:
    sink, checkpoint = write_run(tmp_path, {0: rows_of(0, 40), 1: rows_of(40, 80)}, [40, 80])
    got = check_sink(sink, checkpoint, [0, 1])
    assert got == {"lost_rows": 0, "extra_rows": 0, "inexact_batches": 0, "expected_rows": 80}


def test_a_missing_batch_a_missing_key_and_a_duplicate_are_counted(tmp_path: Path) -> None:
    second = rows_of(40, 80)
    missing_key = second[0]
    batches = {0: rows_of(0, 40) + rows_of(0, 40)[:1], 1: second[1:]}
    sink, checkpoint = write_run(tmp_path, batches, [40, 80, 120])
    got = check_sink(sink, checkpoint, [0, 1, 2])  # batch 2 committed, never written
    assert got["lost_rows"] == missing_key[1] + 40
    assert got["extra_rows"] == rows_of(0, 40)[0][1]
    assert got["inexact_batches"] == 3


def test_a_timeout_is_blamed_only_on_a_fault_of_its_executor_within_the_window() -> None:
    host = Fault("host_freeze", started=100.0, target="host", executors={"1"}, ended=110.0)
    rm = Fault("rm_freeze", started=100.0, target="RM", ended=110.0)
    assert host.covers("1", 105.0) and not host.covers("2", 105.0)
    assert not host.covers("1", 98.0) and not host.covers("1", host.window_end() + 1)
    assert rm.covers("2", 105.0)  # the monitor exempts every executor while the RM is out ...
    assert "2" not in rm.executors  # ... but a timeout during it is no executor's fault
