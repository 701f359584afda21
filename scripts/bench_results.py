"""The site's benchmark table (``docs/developer/benchmarks.md``), from the benchmarks'
``RESULT name=value`` lines.

``make bench`` saves each benchmark's output as ``.cache/bench/<name>.txt``; this script turns
the ``RESULT`` lines of those files into the table between that page's markers, so no figure is
typed by hand. A benchmark without saved output keeps its row as it is (run one benchmark, and
only its row changes).

    python -m scripts.bench_results                   # print the table
    python -m scripts.bench_results --write docs/developer/benchmarks.md  # rewrite it between the markers
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

BEGIN, END = "<!-- bench-results -->", "<!-- /bench-results -->"
HEADER = [
    "| benchmark | what it compares | figures of its last run (`RESULT` lines) |",
    "| --- | --- | --- |",
]

BENCHMARKS: dict[str, str] = {
    "detection_latency": "a SIGSTOPped executor: arrowbeat (1 s / 5 s) vs Spark defaults and Spark with "
    "`spark.network.timeout=10s`",
    "soak_monitoring": "10 minutes fault-free, busy jobs, `tables.retention=2min`: false alarms and the "
    "history tables' file counts",
    "heartbeat_scale": "executors one RM sustains at 1 s interval, p99 RTT < 100 ms",
    "shuffle_transport": "one credit-based channel vs raw TCP sockets (and Flight, and M x N processes)",
    "shuffle_vs_spark": "Arrow pipelines on Spark's shuffle vs arrowbeat's, 20 M rows",
    "shuffle_matrix": "arrowbeat vs Spark on everyday settings: rows x partitions (default 200 + AQE, "
    "8) x keys (uniform, 60% hot) x {groupBy.applyInArrow, repartition.mapInArrow}, every cell; "
    "Dask P2P as a peer (ratios: other / arrowbeat); the checksums' cost on the largest cells (on / off - 1)",
    "e2e_pandas": "a pandas user's job end to end (Parquet in, a pandas function computing several "
    "statistics per key over 20,000 keys, Parquet out, 4 M rows): Spark `applyInPandas`, arrowbeat "
    "`group_by(...).applyInPandas`, Dask P2P `groupby().apply` (ratios: other / arrowbeat)",
    "stuck_tasks": "hung UDFs beside CPU-bound ones, GC pauses under and over the heartbeat timeout, "
    "SIGSTOPs: stuck-task detection, false positives, gaps told apart",
    "cluster_faults": "a standalone cluster, two Workers as hosts: a whole host frozen (arrowbeat 1 s / 5 s) "
    "and a host killed mid-shuffle (time to the exact result vs the same job without a kill)",
    "streaming_soak": "a Structured Streaming query with an arrowbeat grouped shuffle in every micro-batch "
    "(materialized and pipelined by turns, each batch checked against Spark's answer): wrong and failed "
    "batches, RSS per 1,000 shuffles and descriptor growth of every process",
    "job_recovery": "what a job pays (0.5 s / 2 s, `onHeartbeatTimeout=kill`): one executor frozen, one "
    "slowed by a duty cycle (`onDegraded=report` and `exclude`), a skewed healthy run (false DEGRADED), "
    "and with `--long` the frozen case on Spark alone",
}
"""Every benchmark of ``make bench``, in table order, with what it compares (the prose part)."""

_RESULT = re.compile(r"^RESULT (?P<name>[A-Za-z0-9_.]+)=(?P<value>\S.*?)\s*$")
_ROW_NAME = re.compile(r"^\| `benchmarks/(?P<name>[A-Za-z0-9_]+)\.py` \|")


@dataclass(frozen=True)
class Run:
    """The ``RESULT`` figures of one benchmark run, in the order printed, and the run's date."""

    results: dict[str, str]
    date: dt.date | None = None


def parse_results(output: str) -> dict[str, str]:
    """``RESULT name=value`` lines of a benchmark's output; a repeated name keeps its last value."""
    found: dict[str, str] = {}
    for line in output.splitlines():
        match = _RESULT.match(line.strip())
        if match:
            found.pop(match["name"], None)
            found[match["name"]] = match["value"]
    return found


def row(name: str, run: Run) -> str:
    figures = ", ".join(f"`{k}` {v}" for k, v in run.results.items()) or "no `RESULT` lines"
    if run.date is not None:
        figures += f" ({run.date.isoformat()})"
    return f"| `benchmarks/{name}.py` | {BENCHMARKS.get(name, '')} | {figures} |"


def rows_of(table: str) -> dict[str, str]:
    """The rows of an existing table, by benchmark name."""
    found = {}
    for line in table.splitlines():
        match = _ROW_NAME.match(line.strip())
        if match:
            found[match["name"]] = line.strip()
    return found


def render(runs: Mapping[str, Run], previous: str = "") -> str:
    """The table: a fresh row for every benchmark with a run, the previous row for the others."""
    kept = rows_of(previous)
    names = [*BENCHMARKS, *(n for n in [*runs, *kept] if n not in BENCHMARKS)]
    lines = list(HEADER)
    for name in dict.fromkeys(names):
        if name in runs:
            lines.append(row(name, runs[name]))
        elif name in kept:
            lines.append(kept[name])
        else:
            hint = f"not run yet (`make bench BENCH={name}`)"
            lines.append(f"| `benchmarks/{name}.py` | {BENCHMARKS[name]} | {hint} |")
    return "\n".join(lines)


def rewrite(text: str, runs: Mapping[str, Run]) -> str:
    """``text`` (a page with the markers) with the table between them regenerated."""
    if BEGIN not in text or END not in text:
        raise ValueError(f"no {BEGIN} ... {END} markers to put the benchmark table between")
    begin = text.index(BEGIN) + len(BEGIN)
    end = text.index(END, begin)
    return text[:begin] + "\n" + render(runs, text[begin:end]) + "\n" + text[end:]


def load_runs(folder: Path) -> dict[str, Run]:
    """Every ``<name>.txt`` saved by ``make bench``, dated by the file's modification time."""
    runs = {}
    for path in sorted(folder.glob("*.txt")):
        when = dt.datetime.fromtimestamp(path.stat().st_mtime, tz=dt.UTC).date()
        runs[path.stem] = Run(parse_results(path.read_text(errors="replace")), when)
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.bench_results", description=__doc__)
    parser.add_argument("--results", default=".cache/bench", help="folder of saved outputs (<name>.txt)")
    parser.add_argument("--write", metavar="PAGE", help="rewrite the table between the markers there")
    args = parser.parse_args(argv)
    runs = load_runs(Path(args.results))
    if not args.write:
        print(render(runs))
        return 0
    path = Path(args.write)
    try:
        path.write_text(rewrite(path.read_text(), runs))
    except ValueError as exc:
        print(f"{path}: {exc}", file=sys.stderr)
        return 1
    print(f"{path}: benchmark table rewritten from {len(runs)} saved run(s) in {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
