"""``scripts/bench_results.py``: the site's benchmark table is rewritten from ``RESULT`` lines."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import pytest

from scripts.bench_results import BEGIN, BENCHMARKS, END, Run, load_runs, main, parse_results, rewrite

SCALE_OUTPUT = """\
step 250 executors: p99 12.00 ms
RESULT max_executors=3000
RESULT p99_rtt_ms=53.10
median of per-round ratios = 0.61 (not the RESULT ratio)
  RESULT rm_cpu_us_per_heartbeat=196.0
RESULT capped_by_time_budget=0
"""

README = f"""# arrowbeat

Intro.

{BEGIN}
| benchmark | what it compares | figures of its last run (`RESULT` lines) |
| --- | --- | --- |
| `benchmarks/detection_latency.py` | old words | `arrowbeat_detect_s` 4.90 (2026-11-20) |
| `benchmarks/heartbeat_scale.py` | old words | `max_executors` 2000 (2026-11-01) |
{END}

## Contributing
"""


def test_result_lines_are_parsed_in_order_and_nothing_else() -> None:
    assert parse_results(SCALE_OUTPUT) == {
        "max_executors": "3000",
        "p99_rtt_ms": "53.10",
        "rm_cpu_us_per_heartbeat": "196.0",
        "capped_by_time_budget": "0",
    }
    assert list(parse_results("RESULT a=1\nRESULT b=2\nRESULT a=3\n").items()) == [("b", "2"), ("a", "3")]


def test_a_run_replaces_its_row_and_leaves_the_others_and_the_text_around() -> None:
    runs = {"heartbeat_scale": Run(parse_results(SCALE_OUTPUT), dt.date(2026, 11, 23))}
    text = rewrite(README, runs)
    before, table, after = text.partition(BEGIN)[0], text.split(BEGIN)[1].split(END)[0], text.split(END)[1]
    assert before == README.split(BEGIN)[0] and after == README.split(END)[1]
    lines = table.strip().splitlines()
    assert len(lines) == 2 + len(BENCHMARKS)  # header, rule, one row per benchmark in declared order
    assert [line.split("`")[1] for line in lines[2:]] == [f"benchmarks/{n}.py" for n in BENCHMARKS]
    scale = next(line for line in lines if "heartbeat_scale" in line)
    assert scale == (
        f"| `benchmarks/heartbeat_scale.py` | {BENCHMARKS['heartbeat_scale']} | `max_executors` 3000, "
        "`p99_rtt_ms` 53.10, `rm_cpu_us_per_heartbeat` 196.0, `capped_by_time_budget` 0 (2026-11-23) |"
    )
    kept = next(line for line in lines if "detection_latency" in line)
    assert kept == README.splitlines()[7]
    assert "make bench BENCH=shuffle_transport" in table  # never run: says how to run it
    assert rewrite(text, runs) == text  # idempotent


def test_a_readme_without_markers_is_refused() -> None:
    with pytest.raises(ValueError, match="bench-results"):
        rewrite("# no table here\n", {})


def test_the_command_reads_saved_outputs_and_writes_the_readme(tmp_path: Path) -> None:
    saved = tmp_path / "bench"
    saved.mkdir()
    (saved / "heartbeat_scale.txt").write_text(SCALE_OUTPUT)
    stamp = dt.datetime(2026, 11, 23, 12, tzinfo=dt.UTC).timestamp()
    os.utime(saved / "heartbeat_scale.txt", (stamp, stamp))
    assert load_runs(saved)["heartbeat_scale"].date == dt.date(2026, 11, 23)
    readme = tmp_path / "README.md"
    readme.write_text(README)
    assert main(["--results", str(saved), "--write", str(readme)]) == 0
    assert "`max_executors` 3000" in readme.read_text() and "2000" not in readme.read_text()
    (tmp_path / "plain.md").write_text("no markers\n")
    assert main(["--results", str(saved), "--write", str(tmp_path / "plain.md")]) == 1
