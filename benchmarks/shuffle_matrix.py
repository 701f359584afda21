"""arrowbeat against Spark on users' everyday settings: a matrix of cells, every cell reported.

One application on ``local-cluster[2,1,M]`` with Spark's defaults left alone (AQE on,
``spark.sql.shuffle.partitions`` 200) unless a cell says otherwise. Each cell is a cached input
of ``rows`` rows (an int key with nulls, a double, a unicode string with nulls) in 8 partitions and
one operation, timed best of ``--repeat`` on both sides in the same run:

- ``group``: Spark ``df.groupBy("k").applyInArrow(f)`` vs arrowbeat ``group_apply(df, ["k"], f)``;
- ``repart``: Spark ``df.repartition([n,] "k").mapInArrow(g)`` vs ``partition_apply(df, n, ["k"], g)``;
- ``pandas`` (Spark's partitions only: an unchanged job's): Spark ``df.groupBy("k").applyInPandas(h)``
  vs arrowbeat ``group_by(df, "k").applyInPandas(h)``; its ``auto`` column is the unchanged Spark
  call under ``spark.arrowbeat.shuffle.groupedMap=auto`` (the hook a wheel install has from start-up);

over rows {400 k, 4 M, 20 M} x partitions {Spark's default (200, AQE), 8 explicit} x keys
{uniform over 5,003 values, one key holding 60% of the rows}. ``f`` and ``g`` are small Arrow
aggregations (``h`` is ``f`` in pandas), so the shuffle is what is measured. Each cell prints both
times, their ratio (Spark / arrowbeat: above 1 means arrowbeat is faster) and both peak executor
memories (the executors' process trees, sampled every 0.1 s). Peak memory is measured again after the timing
run with each side in applications of its own (one per input, every cell once), since in the shared
one a JVM keeps the heap an earlier Spark run grew: ``RESULT max_peak_mem_ratio`` is from that pass
(``--shared-memory`` skips it and takes the shared application's peaks).

Each input's floor is timed too (best of at least 3, once per input, before its cells): a
``mapInArrow`` that only counts the rows, with no shuffle at all. That is the input's one trip from
the cached rows through the JVM's rows-to-Arrow conversion into Python workers, which arrowbeat's
map tasks make (and Spark's side too, after its exchange). No shuffle that takes its input from
Spark this way, arrowbeat's included, takes a cell below its floor, so ``spark / floor`` (printed as
the cell's ceiling; ``RESULT min_cell_ceiling_ratio``, ``min_20m_cell_ceiling_ratio``) bounds its
ratio in that cell on this machine; ``arrowbeat / floor`` is what its shuffle and grouping add.
The floor is one measurement per input while load moves, so read a ceiling to within that noise.
Over the 20 M-row ``group`` cells: ``RESULT min_20m_group_ratio`` (the lowest Spark / arrowbeat)
and ``RESULT max_floor_ratio`` (the highest arrowbeat / floor).
``RESULT load_1m`` is the 1-minute load average before and after the run (the run's own included).

The closing figures include what the map-output and frame checksums cost
(``spark.arrowbeat.shuffle.checksum``, one application-wide key; issue 36's goal: at most 3% on the
20 M cells). After the timing run, the arrowbeat side of the largest-rows cells (the 20 M cells in a
full run) runs again in applications of their own, one per input and setting, checksums off and on
by turns (off, on, then on, off, ``--repeat`` rounds), each application warmed first, every cell
once per application; each setting's best counts. Not the shared application's on-figure: its JVMs
had grown the heaps of Spark's runs before it, and load drifts over a run, so both settings are
timed the same way, close together. Each cell prints its ``checksum on/off`` times and
``cost = on/off - 1``; ``RESULT checksum_cost_max`` (the worst cell, a fraction: 0.021 is 2.1%) and
``RESULT checksum_cost_median``. A cost within the spread of best-of-N here (a few percent) reads as
"no cost seen", a negative one as noise. Two runs of one setting differ by more than that here,
so the pass ends with the cost measured where the checksums act (``benchmarks.checksum_cost``:
one map task's output of each largest input written and read back, on and off, in CPU time):
``RESULT checksum_task_cost.<keys>.<reducers>`` and ``RESULT checksum_cell_share_max`` (the largest share of
a cell's arrowbeat time that its map outputs' extra CPU takes on the 2 cores).
``--no-checksum-cost`` skips the pass.

An ``auto`` column runs the same arrowbeat call with ``path="auto"`` (``spark_plugin.shuffle.driver.route``:
Spark's exchange below a measured input size, arrowbeat's above): its ratio is Spark / auto, and
each input's size as the optimizer reports it (the cached relation's real size, the number the
routing decides on) is printed beside it, so the crossover can be read off in bytes. Spark's and
the ``auto`` runs alternate (``best_alternating``). Each ``auto`` cell names the path it took:
where it was Spark's, both columns ran Spark's plan and the ratio is the spread of best-of-N on
this machine (plus the routing's milliseconds), so ``RESULT worst_cell_ratio_auto_arrowbeat_path``
and ``..._spark_path`` report the two kinds apart.

The ``wide`` cell (``--ops wide``) is the wide schema (issue 39): ``--wide-rows`` rows of
``--wide-columns`` columns (the int key, the double ``x``, then doubles), ``repart`` into
``--wide-reducers`` partitions, in an application of its own (its UI on: Spark's shuffle write bytes
are read from its REST API). It prints both times and their ratio, Spark's shuffle write bytes
(compressed, ``spark.io.compression.codec``), and arrowbeat's map-output files on disk against the
Arrow data they hold: the bodies of the record batches (segment bytes less each batch message's
metadata, which is the same for every batch of a schema), the metadata, and the files' headers
(the schema, once per file). ``RESULT wide_bytes_vs_arrow_bodies``, ``wide_bytes_vs_spark`` and
``wide_time_ratio`` (Spark / arrowbeat). The cell is not a row of the matrix's tables: its
input is not the others'.

Also, when Dask is installed (``pip install .[bench]``), a peer on the same data in the same run:
Dask distributed's P2P shuffle (``groupby("k").apply(f, shuffle_method="p2p")`` on a
``LocalCluster`` of 2 workers x 1 thread), beside arrowbeat's ``group_apply`` of the largest
uniform cell with default partitions: ``RESULT vs_dask_p2p=<dask / arrowbeat>``.

    .venv/bin/python -m benchmarks.shuffle_matrix [--rows 400000,4000000,20000000] [--repeat 2] [--no-auto]
        [--shared-memory] [--no-checksum-cost]
        [--ops group,repart] [--keys uniform,hot] [--partitions default,8]   (a subset of the cells)
        [--ops wide --wide-rows 100000]   (the wide-schema cell alone)
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from benchmarks.checksum_cost import INPUT_PARTITIONS, KEYS
from benchmarks.e2e_pandas import count_rows
from benchmarks.shuffle_vs_spark import PeakMemory
from harness.env import prepare
from harness.procs import ours, wait_until
from harness.session import build_session, stop_session

SUMMARY = "k int, n bigint, sx double"
PARTIAL = "rows bigint, sx double"


def summarize(table: pa.Table) -> pa.Table:
    """One row per key group: its key, rows and the sum of x."""
    return pa.table(
        {
            "k": pa.array([table.column("k")[0].as_py()], pa.int32()),
            "n": pa.array([table.num_rows], pa.int64()),
            "sx": pa.array([pc.sum(table.column("x")).as_py()], pa.float64()),
        }
    )


def summarize_frame(group: Any) -> Any:
    """``summarize`` as a pandas user writes it (``applyInPandas``'s ``func(pdf)``)."""
    import pandas as pd

    return pd.DataFrame({"k": group["k"].iloc[:1].to_numpy(), "n": [len(group)], "sx": [group["x"].sum()]})


def partial(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """One row per partition: rows and the sum of x (streaming)."""
    rows, sx = 0, 0.0
    for batch in batches:
        rows += batch.num_rows
        sx += pc.sum(batch.column("x")).as_py() or 0.0
    yield pa.record_batch({"rows": pa.array([rows], pa.int64()), "sx": pa.array([sx], pa.float64())})


def key_expr(kind: str) -> str:
    uniform = f"CASE WHEN id % 997 = 0 THEN NULL ELSE CAST(pmod(hash(id), {KEYS}) AS INT) END"
    if kind == "uniform":
        return uniform
    return f"CASE WHEN pmod(hash(id, 7), 10) < 6 THEN 0 ELSE {uniform} END"  # one key: 60% of rows


def best(step: Callable[[], Any], repeat: int) -> tuple[float, int]:
    """Fastest of ``repeat`` runs, and the highest peak executor memory seen."""
    times, peaks = [], []
    for _ in range(repeat):
        with PeakMemory() as memory:
            started = time.perf_counter()
            step()
            times.append(time.perf_counter() - started)
        peaks.append(memory.peak)
    return min(times), max(peaks)


def best_alternating(steps: list[Callable[[], Any]], repeat: int) -> list[tuple[float, int]]:
    """``best`` of each step, the steps run in turns (A, B, A, B): the ``auto`` column's cells
    that take Spark's path run Spark's plan, so their ratio is Spark against itself plus the
    routing; run back to back, a change of load between the two best-ofs would decide it."""
    times: list[list[float]] = [[] for _ in steps]
    peaks: list[list[int]] = [[] for _ in steps]
    for _ in range(repeat):
        for index, step in enumerate(steps):
            with PeakMemory() as memory:
                started = time.perf_counter()
                step()
                times[index].append(time.perf_counter() - started)
            peaks[index].append(memory.peak)
    return [(min(t), max(p)) for t, p in zip(times, peaks, strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="400000,4000000,20000000", help="comma-separated row counts")
    parser.add_argument("--repeat", type=int, default=2, help="runs per side and cell; the best counts")
    parser.add_argument("--worker-mb", type=int, default=2048, help="M of local-cluster[2,1,M]")
    parser.add_argument("--no-dask", action="store_true", help="skip the Dask P2P peer")
    parser.add_argument("--no-auto", action="store_true", help="skip the path='auto' column")
    parser.add_argument(
        "--shared-memory",
        action="store_true",
        help="skip the own-application memory pass: peak memory only from the shared application",
    )
    parser.add_argument(
        "--no-checksum-cost",
        action="store_true",
        help="skip the checksums' cost (the largest-rows cells' arrowbeat side, checksum off vs on)",
    )
    parser.add_argument(
        "--ops",
        default="group,repart,pandas,wide",
        help="comma-separated operations to run (group, repart, pandas; wide: the wide-schema cell)",
    )
    parser.add_argument("--wide-rows", type=int, default=200_000, help="rows of the wide-schema cell")
    parser.add_argument("--wide-columns", type=int, default=200, help="columns of the wide-schema cell")
    parser.add_argument(
        "--wide-reducers", type=int, default=200, help="reduce partitions of the wide-schema cell"
    )
    parser.add_argument("--keys", default="uniform,hot", help="comma-separated key shapes to run")
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting for every application of the run (repeatable), e.g. an A/B of "
        "spark.arrowbeat.shuffle.mapMemory; named in the cells= line",
    )
    parser.add_argument(
        "--partitions", default="default,8", help="comma-separated partition settings to run (default, 8)"
    )
    args = parser.parse_args()
    ops = args.ops.split(",")
    sizes = [int(r) for r in args.rows.split(",")] if set(ops) - {"wide"} else []  # the matrix's inputs
    for setting in args.conf:
        if "=" not in setting:
            parser.error(f"--conf {setting!r}: expected KEY=VALUE")

    from spark_plugin.compat.plan_stats import plan_size
    from spark_plugin.shuffle import group_apply, partition_apply, release

    scratch = prepare()  # loopback, the venv's Python everywhere, the run marker
    _check_hooked()
    load_before = os.getloadavg()
    spark = _session(scratch, args, "shuffle-matrix")
    cells: list[dict[str, Any]] = []
    arrow_uniform_default: dict[int, float] = {}
    try:
        warm = spark.range(0, 20_000, numPartitions=2).selectExpr(
            f"{key_expr('uniform')} AS k", "cast(id AS double) * 0.5 AS x"
        )
        for step in (
            lambda: warm.groupBy("k").applyInArrow(summarize, SUMMARY).collect(),
            lambda: release(out) if (out := group_apply(warm, ["k"], summarize, SUMMARY)).collect() else 0,
        ):
            step()
        for rows in sizes:
            for keys in args.keys.split(","):
                df = _cached_input(spark, rows, keys)
                size = plan_size(df).bytes or 0  # the cached relation's real size, as routing sees it
                floor_s, _ = best(functools.partial(_floor, df), max(3, args.repeat))  # one per input
                print(
                    f"input rows={rows:,} keys={keys}: {size:,} bytes (optimizer statistics); "
                    f"floor {floor_s:.2f} s (the input's one trip into Python workers, no shuffle)",
                    flush=True,
                )
                for partitions in args.partitions.split(","):
                    n = None if partitions == "default" else 8
                    for op in ops:
                        if op == "wide" or (op == "pandas" and n is not None):
                            continue  # wide: a cell of its own; applyInPandas: Spark's partitions
                        spark_step, arrow_step = _steps(df, op, n, group_apply, partition_apply, release)
                        arrow_s, arrow_mem = best(arrow_step, args.repeat)  # first: see shuffle_vs_spark
                        auto_s = None
                        if args.no_auto:
                            spark_s, spark_mem = best(spark_step, args.repeat)
                        else:
                            auto_paths: list[str] = []
                            _, auto_step = _steps(
                                df, op, n, group_apply, partition_apply, release, "auto", auto_paths
                            )
                            (spark_s, spark_mem), (auto_s, _) = best_alternating(
                                [spark_step, auto_step], args.repeat
                            )
                        cell = {
                            "rows": rows,
                            "keys": keys,
                            "partitions": partitions,
                            "op": op,
                            "spark_s": spark_s,
                            "arrow_s": arrow_s,
                            "ratio": spark_s / arrow_s,
                            "spark_mem": spark_mem,
                            "arrow_mem": arrow_mem,
                            "bytes": size,
                            "floor_s": floor_s,
                            "ceiling": spark_s / floor_s,
                            "auto_ratio": None if auto_s is None else spark_s / auto_s,
                            "auto_path": None if auto_s is None else "/".join(sorted(set(auto_paths))),
                        }
                        cells.append(cell)
                        if keys == "uniform" and partitions == "default" and op == "group":
                            arrow_uniform_default[rows] = arrow_s
                        print(
                            f"rows={rows:>10,} keys={keys:7s} partitions={partitions:7s} op={op:6s} "
                            f"spark {spark_s:7.2f} s  arrowbeat {arrow_s:7.2f} s  "
                            f"ratio {cell['ratio']:5.2f} (ceiling {cell['ceiling']:5.2f}, "
                            f"arrowbeat / floor {arrow_s / floor_s:4.2f})  "
                            f"peak MiB spark {spark_mem / 2**20:6.0f} arrowbeat {arrow_mem / 2**20:6.0f}"
                            + (
                                ""
                                if auto_s is None
                                else f"  auto {auto_s:7.2f} s ratio {spark_s / auto_s:5.2f} "
                                f"({cell['auto_path']}'s path)"
                            ),
                            flush=True,
                        )
                df.unpersist()
    finally:
        stop_session(spark)
    wide = _wide_cell(scratch, args, partition_apply, release) if "wide" in ops else None
    if not args.shared_memory:
        _memory_pass(scratch, args, cells, group_apply, partition_apply, release)
    costs = (
        []
        if args.no_checksum_cost or not cells
        else _checksum_pass(scratch, args, cells, group_apply, partition_apply, release)
    )
    dask_ratio = None
    if not args.no_dask and arrow_uniform_default:
        rows = max(arrow_uniform_default)
        dask_s = _dask_p2p(rows)
        if dask_s is not None:
            dask_ratio = dask_s / arrow_uniform_default[rows]
            print(
                f"dask p2p group apply, {rows:,} rows uniform: {dask_s:.2f} s "
                f"(arrowbeat {arrow_uniform_default[rows]:.2f} s)"
            )
    shutil.rmtree(scratch, ignore_errors=True)
    if not cells:  # the wide cell alone
        load_after = os.getloadavg()
        print(f"\nload average before {load_before[0]:.2f}, after {load_after[0]:.2f} (2 cores)")
        print(f"RESULT load_1m={load_before[0]:.2f}->{load_after[0]:.2f}")
        _print_wide(wide)
        return

    ratios = [c["ratio"] for c in cells]
    worst = min(cells, key=lambda c: c["ratio"])
    own = "own_spark_mem" in cells[0]
    mem_ratio = max(
        c["own_arrow_mem"] / c["own_spark_mem"] if own else c["arrow_mem"] / c["spark_mem"] for c in cells
    )
    load_after = os.getloadavg()
    print()
    print(
        f"{len(cells)} cells, best of {args.repeat}; load average before {load_before[0]:.2f}, "
        f"after {load_after[0]:.2f} (2 cores)"
    )
    print(
        f"worst cell: rows={worst['rows']:,} keys={worst['keys']} partitions={worst['partitions']} "
        f"op={worst['op']}"
    )
    big_cells = [c for c in cells if c["rows"] >= 20_000_000]
    # What ran, so a partial run's figures are not read as the whole matrix's.
    print(
        f"RESULT cells={len(cells)} (rows {args.rows.replace(',', '/')}; ops {args.ops.replace(',', '/')}; "
        f"keys {args.keys.replace(',', '/')}; partitions {args.partitions.replace(',', '/')}; "
        f"best of {args.repeat}"
        + ("; no auto column" if args.no_auto else "")
        + ("; no Dask" if args.no_dask else "")
        + ("; memory from the shared application" if args.shared_memory else "")
        + ("; no checksum cost" if args.no_checksum_cost else "")
        + "".join(f"; {setting}" for setting in args.conf)
        + ")"
    )
    print(f"RESULT load_1m={load_before[0]:.2f}->{load_after[0]:.2f}")
    print(f"RESULT worst_cell_ratio={min(ratios):.3f}")
    print(f"RESULT min_cell_ceiling_ratio={min(c['ceiling'] for c in cells):.3f}")
    if big_cells:
        print(f"RESULT min_20m_cell_ceiling_ratio={min(c['ceiling'] for c in big_cells):.3f}")
    print(f"RESULT median_cell_ratio={statistics.median(ratios):.3f}")
    if big_cells:
        print(f"RESULT min_20m_cell_ratio={min(c['ratio'] for c in big_cells):.3f}")
    big_groups = [c for c in big_cells if c["op"] == "group"]
    if big_groups:  # issue 39's measures: the 20 M group cells against Spark and against the floor
        print(f"RESULT min_20m_group_ratio={min(c['ratio'] for c in big_groups):.3f}")
        print(f"RESULT max_floor_ratio={max(c['arrow_s'] / c['floor_s'] for c in big_groups):.3f}")
    print(
        "peak memory ratio from "
        + ("each side's own application per input" if own else "the shared application (--shared-memory)")
    )
    print(f"RESULT max_peak_mem_ratio={mem_ratio:.3f}")
    autos = [c["auto_ratio"] for c in cells if c["auto_ratio"] is not None]
    if autos:
        print(f"RESULT worst_cell_ratio_auto={min(autos):.3f}")
        print(f"RESULT median_cell_ratio_auto={statistics.median(autos):.3f}")
        # Where auto took Spark's path both columns ran Spark's plan: those ratios are the spread
        # of best-of-N on this machine (plus the routing's milliseconds), not arrowbeat's speed.
        for path in ("arrowbeat", "spark"):
            on = [c["auto_ratio"] for c in cells if c["auto_ratio"] is not None and c["auto_path"] == path]
            if on:
                print(f"RESULT worst_cell_ratio_auto_{path}_path={min(on):.3f}")
    if dask_ratio is not None:
        print(f"RESULT vs_dask_p2p={dask_ratio:.3f}")
    if costs:
        print(
            f"checksum cost over {len(costs)} cells of {max(c['rows'] for c in cells):,} rows "
            "(arrowbeat side, on/off - 1, each setting in applications of its own, by turns)"
        )
        print(f"RESULT checksum_cost_max={max(costs):.3f}")
        print(f"RESULT checksum_cost_median={statistics.median(costs):.3f}")
        _print_task_costs(cells)
    _print_wide(wide)


def _print_task_costs(cells: list[dict[str, Any]]) -> None:
    """The checksums' cost measured where they act (``benchmarks.checksum_cost``): one map
    task's output of each largest-rows cell's input written and read back for the cell's
    reducers (200 at Spark's default partitions: AQE coalesces reduce tasks, not map outputs'
    segments), on and off, 7 rounds, in this process's CPU time; and the share of the cell that
    its 8 map outputs' extra CPU is, over the cluster's 2 cores, against the cell's best time
    with checksums off. Steadier than the applications' times above, whose runs of one setting
    differ by more than the goal's 3 %."""
    from benchmarks.checksum_cost import task_cost

    largest = max(c["rows"] for c in cells)
    shares = []
    measured: dict[tuple[str, int], Any] = {}
    for cell in (c for c in cells if c["rows"] == largest):
        reducers = 200 if cell["partitions"] == "default" else int(cell["partitions"])
        shape = (cell["keys"], reducers)
        if shape not in measured:
            cost = measured[shape] = task_cost(largest, cell["keys"], reducers, 7, verbose=False)
            print(
                f"map task of {largest:,} rows / 8, keys={cell['keys']}, {reducers} reducers: write "
                f"{cost.write:+.3f}, read {cost.read:+.3f}, both {cost.task:+.3f} (spread "
                f"{cost.task_spread:.3f}), {cost.extra_s * 1000:+.0f} ms CPU per map output"
            )
            print(f"RESULT checksum_task_cost.{cell['keys']}.{reducers}={cost.task:.3f}")
        shares.append(measured[shape].cell_cost(min(cell["checksum_s"]["off"]), 2))
    print(f"RESULT checksum_cell_share_max={max(shares):.3f}")


def _wide_cell(scratch: Any, args: Any, partition_apply: Any, release: Any) -> dict[str, Any]:
    """The wide-schema cell in an application of its own: both sides' best time (in turns) and
    bytes written. Spark's from its REST API (the stages' ``shuffleWriteBytes``, over one run);
    arrowbeat's from its map-output files on disk (read before the shuffle is released) and its
    write reports (segment bytes and batches: the Arrow bodies are the segments less each
    batch's message metadata)."""
    from spark_plugin.shuffle import shuffle_of

    if not wait_until(lambda: not ours("CoarseGrainedExecutorBackend"), 60):
        raise RuntimeError("the previous application's executors are still running after 60 s")
    rows, columns, n = args.wide_rows, args.wide_columns, args.wide_reducers
    spark = _session(scratch, args, "shuffle-matrix-wide", {"spark.ui.enabled": "true", "spark.ui.port": "0"})
    try:
        df = (
            spark.range(0, rows, numPartitions=8)
            .selectExpr(
                f"{key_expr('uniform')} AS k",
                "cast(id % 1000 AS double) * 0.5 AS x",
                *(f"cast((id * {c}) % 100003 AS double) * 0.25 AS c{c}" for c in range(2, columns)),
            )
            .cache()
        )
        df.count()
        files_root = scratch / "shuffle"
        seen: dict[str, Any] = {}

        def spark_step() -> Any:
            return df.repartition(n, "k").mapInArrow(partial, PARTIAL).collect()

        def arrow_step() -> Any:
            out = partition_apply(df, n, ["k"], partial, PARTIAL)
            try:
                result = out.collect()
                seen["file_bytes"] = sum(f.stat().st_size for f in files_root.rglob("*.arrows"))
                seen["files"] = sum(1 for _ in files_root.rglob("*.arrows"))
                seen["reports"] = [r for r in shuffle_of(out).reports() if r["side"] == "write"]
                seen["schema"] = shuffle_of(out).plan.schema
                return result
            finally:
                release(out)

        spark_step(), arrow_step()  # warm: workers forked, plans compiled
        (spark_s, _), (arrow_s, _) = best_alternating([spark_step, arrow_step], args.repeat)
        before = _shuffle_write_bytes(spark)
        spark_step()
        # The status store hears of the stages' ends after the job returns (Spark's listener bus).
        totals = [before]

        def settled() -> bool:
            totals.append(_shuffle_write_bytes(spark))
            return totals[-1] == totals[-2] > before

        wait_until(settled, 30, 0.5)
        spark_bytes = totals[-1] - before
    finally:
        stop_session(spark)
    schema = seen["schema"]
    one = pa.record_batch([pa.nulls(1, field.type) for field in schema], schema=schema).serialize()
    metadata = one.size - pa.ipc.read_message(one).body.size  # the same for every batch of the schema
    reports = seen["reports"]
    segments = sum(int(r["bytes"]) for r in reports)
    batches = sum(int(r["batches"]) for r in reports)
    bodies = segments - batches * metadata
    return {
        "rows": rows,
        "columns": columns,
        "reducers": n,
        "spark_s": spark_s,
        "arrow_s": arrow_s,
        "spark_bytes": spark_bytes,
        "file_bytes": seen["file_bytes"],
        "files": seen["files"],
        "bodies": bodies,
        "metadata": batches * metadata,
        "batches": batches,
        "headers": seen["file_bytes"] - segments,
    }


def _shuffle_write_bytes(spark: Any) -> int:
    """Spark's shuffle write bytes over every stage of the application so far (its REST API)."""
    url = f"{spark.sparkContext.uiWebUrl}/api/v1/applications/{spark.sparkContext.applicationId}/stages"
    with urllib.request.urlopen(url, timeout=30) as answer:
        return sum(int(stage.get("shuffleWriteBytes", 0)) for stage in json.load(answer))


def _print_wide(wide: dict[str, Any] | None) -> None:
    if wide is None:
        return
    file_bytes = wide["file_bytes"]
    print(
        f"wide: {wide['rows']:,} rows x {wide['columns']} columns, {wide['reducers']} reducers: "
        f"spark {wide['spark_s']:.2f} s arrowbeat {wide['arrow_s']:.2f} s ratio "
        f"{wide['spark_s'] / wide['arrow_s']:.2f}; bytes written: spark {wide['spark_bytes']:,} "
        "(compressed), "
        f"arrowbeat {file_bytes:,} in {wide['files']} files = Arrow bodies {wide['bodies']:,} + batch "
        f"metadata {wide['metadata']:,} ({wide['batches']:,} batches) + headers {wide['headers']:,}",
        flush=True,
    )
    print(f"RESULT wide_bytes_vs_arrow_bodies={file_bytes / wide['bodies']:.3f}")
    print(f"RESULT wide_bytes_vs_arrow_messages={file_bytes / (wide['bodies'] + wide['metadata']):.4f}")
    print(f"RESULT wide_bytes_vs_spark={file_bytes / max(1, wide['spark_bytes']):.3f}")
    print(f"RESULT wide_time_ratio={wide['spark_s'] / wide['arrow_s']:.3f}")


def _session(scratch: Any, args: argparse.Namespace, name: str, conf: dict[str, str] | None = None) -> Any:
    """The matrix's application: Spark's defaults but for memory (``spark.sql.shuffle.partitions``
    back at 200), arrowbeat's dirs in ``scratch``, then the run's ``--conf`` settings, then
    ``conf`` (a pass's own setting wins over the run's)."""
    return build_session(
        f"local-cluster[2,1,{args.worker_mb}]",
        scratch,
        name,
        conf={
            "spark.executor.memory": "1g",
            "spark.sql.shuffle.partitions": "200",  # Spark's default (build_session sets 4)
            "spark.arrowbeat.shuffle.dir": str(scratch / "shuffle"),
            "spark.arrowbeat.tables.path": str(scratch / "tables"),
            **dict(setting.split("=", 1) for setting in args.conf),
            **(conf or {}),
        },
    )


def _floor(df: Any) -> Any:
    """The input's one trip into Python workers, its rows counted, no shuffle: the floor."""
    return df.mapInArrow(count_rows, "rows long").collect()


def _cached_input(spark: Any, rows: int, keys: str) -> Any:
    """A cell's input, cached and counted: ``rows`` rows in ``INPUT_PARTITIONS`` (8) partitions
    of an int key (``keys``: uniform or hot), a double and a unicode string with nulls."""
    df = (
        spark.range(0, rows, numPartitions=INPUT_PARTITIONS)
        .selectExpr(
            f"{key_expr(keys)} AS k",
            "cast(id % 1000 AS double) * 0.5 AS x",
            "CASE WHEN id % 13 = 0 THEN NULL ELSE concat('ключ-', id % 211, '-é') END AS s",
        )
        .cache()
    )
    df.count()
    return df


def _memory_pass(
    scratch: Any, args: Any, cells: list[dict[str, Any]], group_apply: Any, partition_apply: Any, release: Any
) -> None:
    """Each side's peak executor memory in applications of its own: for each input, its cells
    once on Spark's path in one application, then on arrowbeat's in another, in the timing run's
    order.

    In the shared application a JVM keeps the heap an earlier run grew (Spark's sort grows it,
    arrowbeat's path hardly does), so a cell's arrowbeat peak there holds Spark's heap from the
    cells before it; here each side carries only its own earlier cells of the same input (the
    timing ratios stay from the shared application, where both sides alternate under the same
    load). One application per input, not per side: a cell's figure then does not depend on
    which other inputs happened to run before it (in one application per side, the first cell
    of the second input carried the executors' and workers' growth from all cells of the first)."""
    inputs: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for cell in cells:
        inputs.setdefault((cell["rows"], cell["keys"]), []).append(cell)
    for (rows, keys), input_cells in inputs.items():
        for side in ("spark", "arrow"):
            # The previous application's executors (sampled by PeakMemory) gone before this one starts.
            if not wait_until(lambda: not ours("CoarseGrainedExecutorBackend"), 60):
                raise RuntimeError("the previous application's executors are still running after 60 s")
            spark = _session(scratch, args, f"shuffle-matrix-memory-{side}")
            try:
                df = _cached_input(spark, rows, keys)
                for cell in input_cells:
                    n = None if cell["partitions"] == "default" else 8
                    steps = _steps(df, cell["op"], n, group_apply, partition_apply, release)
                    with PeakMemory() as memory:
                        (steps[0] if side == "spark" else steps[1])()
                    cell[f"own_{side}_mem"] = memory.peak
                    cell[f"own_{side}_where"] = memory.breakdown()
            finally:
                stop_session(spark)
    for cell in cells:
        print(
            f"rows={cell['rows']:>10,} keys={cell['keys']:7s} partitions={cell['partitions']:7s} "
            f"op={cell['op']:6s} peak MiB, each side in its own application per input: "
            f"spark {cell['own_spark_mem'] / 2**20:6.0f} arrowbeat {cell['own_arrow_mem'] / 2**20:6.0f} "
            f"ratio {cell['own_arrow_mem'] / cell['own_spark_mem']:5.2f}",
            flush=True,
        )
        # Where each side's peak was (MiB at that moment, by kind of process): a Python worker
        # reused from an earlier cell keeps what it grew there (``spark.python.worker.reuse``).
        print(f"    at spark's peak: {cell['own_spark_where']}", flush=True)
        print(f"    at arrowbeat's peak: {cell['own_arrow_where']}", flush=True)


CHECKSUM_KEY = "spark.arrowbeat.shuffle.checksum"


def _checksum_pass(
    scratch: Any, args: Any, cells: list[dict[str, Any]], group_apply: Any, partition_apply: Any, release: Any
) -> list[float]:
    """The checksums' cost on the arrowbeat side of the largest-rows cells: ``on / off - 1`` per
    cell, each setting's best over ``args.repeat`` applications of its own per input.

    The key is application-wide (an agent frames with its application's setting), so each
    setting needs applications of its own. Rounds alternate the order (off, on; on, off; ...), so
    a drift of load over the pass falls on both settings alike; each application is warmed
    (Python workers forked, the JVM's first plans compiled) before its cells, which run in the
    timing run's order, so a cell's cold or warm start is the same for both settings."""
    largest = max(c["rows"] for c in cells)
    inputs: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for cell in cells:
        if cell["rows"] == largest:
            inputs.setdefault((cell["rows"], cell["keys"]), []).append(cell)
    for (rows, keys), input_cells in inputs.items():
        for cell in input_cells:
            cell["checksum_s"] = {"on": [], "off": []}
        for round_ in range(max(1, args.repeat)):
            for setting in ("off", "on") if round_ % 2 == 0 else ("on", "off"):
                if not wait_until(lambda: not ours("CoarseGrainedExecutorBackend"), 60):
                    raise RuntimeError("the previous application's executors are still running after 60 s")
                spark = _session(
                    scratch,
                    args,
                    f"shuffle-matrix-checksum-{setting}",
                    {CHECKSUM_KEY: "true" if setting == "on" else "false"},
                )
                try:
                    warm = _cached_input(spark, 200_000, keys)
                    for cell in input_cells:  # every kind of call once: workers and plans warm
                        n = None if cell["partitions"] == "default" else 8
                        _steps(warm, cell["op"], n, group_apply, partition_apply, release)[1]()
                    warm.unpersist()
                    df = _cached_input(spark, rows, keys)
                    for cell in input_cells:
                        n = None if cell["partitions"] == "default" else 8
                        arrow_step = _steps(df, cell["op"], n, group_apply, partition_apply, release)[1]
                        started = time.perf_counter()
                        arrow_step()
                        cell["checksum_s"][setting].append(time.perf_counter() - started)
                    df.unpersist()
                finally:
                    stop_session(spark)
    costs = []
    for input_cells in inputs.values():
        for cell in input_cells:
            on, off = min(cell["checksum_s"]["on"]), min(cell["checksum_s"]["off"])
            cell["checksum_cost"] = on / off - 1
            costs.append(cell["checksum_cost"])
            print(
                f"rows={cell['rows']:>10,} keys={cell['keys']:7s} partitions={cell['partitions']:7s} "
                f"op={cell['op']:6s} arrowbeat checksum on {on:7.2f} s off {off:7.2f} s  "
                f"cost {cell['checksum_cost']:+.3f}  (runs on "
                + "/".join(f"{t:.2f}" for t in cell["checksum_s"]["on"])
                + ", off "
                + "/".join(f"{t:.2f}" for t in cell["checksum_s"]["off"])
                + ")",
                flush=True,
            )
    return costs


def _steps(
    df: Any,
    op: str,
    n: int | None,
    group_apply: Any,
    partition_apply: Any,
    release: Any,
    path: str | None = None,
    paths: list[str] | None = None,
) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """The Spark and the arrowbeat side of one cell; each arrowbeat run releases its shuffle (a
    call routed to Spark's path has none: ``release`` returns 0). ``path``: the routing argument
    (None: the key's, arrowbeat's path by default); ``paths`` collects the path each run took."""
    from spark_plugin.shuffle.driver.route import route_of

    routing = {} if path is None else {"path": path}

    def collected(out: Any) -> Any:
        """``out``'s rows, its shuffle released, the path it took noted in ``paths``."""
        decided = route_of(out)
        shuffled = "_arrowbeat_shuffle" in vars(out)
        if paths is not None:  # no decision recorded: arrowbeat's shuffle ran, or the hook left it
            paths.append(decided.path if decided is not None else "arrowbeat" if shuffled else "spark")
        try:
            return out.collect()
        finally:
            if shuffled or decided is not None:  # a call the hook left to Spark has nothing to release
                release(out)

    if op == "pandas":
        return _pandas_steps(df, collected, path)
    if op == "group":

        def spark_step() -> Any:
            return df.groupBy("k").applyInArrow(summarize, SUMMARY).collect()

        def arrow_step() -> Any:
            return collected(group_apply(df, ["k"], summarize, SUMMARY, num_partitions=n, **routing))

    else:

        def spark_step() -> Any:
            shuffled = df.repartition("k") if n is None else df.repartition(n, "k")
            return shuffled.mapInArrow(partial, PARTIAL).collect()

        def arrow_step() -> Any:
            return collected(partition_apply(df, n, ["k"], partial, PARTIAL, **routing))

    return spark_step, arrow_step


def _pandas_steps(
    df: Any, collected: Callable[[Any], Any], path: str | None
) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """An unchanged ``df.groupBy("k").applyInPandas(f, schema)``: Spark's with ``groupedMap=off``;
    arrowbeat's ``group_by(df, "k").applyInPandas`` (the same API, called explicitly), or with
    ``path="auto"`` the same unchanged call under ``groupedMap=auto`` (the hook decides)."""
    from spark_plugin.compat.grouped_map_hook import KEY
    from spark_plugin.shuffle import group_by

    spark = df.sparkSession

    def spark_step() -> Any:
        spark.conf.set(KEY, "off")
        return df.groupBy("k").applyInPandas(summarize_frame, SUMMARY).collect()

    def arrow_step() -> Any:
        if path == "auto":
            spark.conf.set(KEY, "auto")
            try:
                out = df.groupBy("k").applyInPandas(summarize_frame, SUMMARY)
            finally:
                spark.conf.set(KEY, "off")
        else:
            out = group_by(df, "k").applyInPandas(summarize_frame, SUMMARY)
        return collected(out)

    return spark_step, arrow_step


def _check_hooked() -> None:
    """The ``pandas`` cells' ``auto`` column needs the grouped-map hook that ``arrowbeat.pth``
    installs at start-up, in a wheel's venv and in the checkout's (``make setup``) alike: without
    it the column would silently time Spark's path, so the run stops with what to do."""
    from pyspark.sql.classic.dataframe import DataFrame

    if not getattr(DataFrame.groupBy, "__arrowbeat_wrapped__", False):
        raise SystemExit(
            "the grouped-map hook is not active in this venv (arrowbeat.pth missing): "
            "rerun make setup, or pip install the wheel"
        )


def _spark_hash(ids: Any) -> Any:
    """``spark_plugin.shuffle.driver.adaptive.spark_hash_long`` over a numpy array of int64, vectorised."""
    import numpy as np

    m = np.uint64(0xFFFFFFFF)

    def rotl(x: Any, r: int) -> Any:
        return ((x << np.uint64(r)) | (x >> np.uint64(32 - r))) & m

    def mix_k1(k1: Any) -> Any:
        return (rotl((k1 * np.uint64(0xCC9E2D51)) & m, 15) * np.uint64(0x1B873593)) & m

    def mix_h1(h1: Any, k1: Any) -> Any:
        return (rotl(h1 ^ k1, 13) * np.uint64(5) + np.uint64(0xE6546B64)) & m

    u = ids.view(np.uint64)
    h1 = mix_h1(np.full(len(ids), 42, dtype=np.uint64), mix_k1(u & m))
    h1 = mix_h1(h1, mix_k1(u >> np.uint64(32))) ^ np.uint64(8)
    h1 ^= h1 >> np.uint64(16)
    h1 = (h1 * np.uint64(0x85EBCA6B)) & m
    h1 ^= h1 >> np.uint64(13)
    h1 = (h1 * np.uint64(0xC2B2AE35)) & m
    h1 ^= h1 >> np.uint64(16)
    return h1.astype(np.int64) - ((h1 >> np.uint64(31)).astype(np.int64) << 32)


def _dask_p2p(rows: int) -> float | None:
    """Dask distributed's P2P shuffle on the same data (generated with the same formulas)."""
    try:
        import dask.dataframe as dd
        import numpy as np
        import pandas as pd
        from distributed import Client, LocalCluster
    except ImportError:
        print("dask is not installed (pip install .[bench]): no Dask P2P peer in this run")
        return None

    ids = np.arange(rows, dtype=np.int64)
    k = np.mod(_spark_hash(ids), KEYS).astype("float64")  # Spark's pmod(hash(id), 5003)
    k[ids % 997 == 0] = np.nan
    frame = pd.DataFrame({"k": k, "x": (ids % 1000).astype("float64") * 0.5})

    def summarize_pandas(group: pd.DataFrame, run: int = 0) -> pd.DataFrame:
        return pd.DataFrame({"n": [len(group)], "sx": [group["x"].sum()]})

    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
        Client(cluster),
    ):
        ddf = dd.from_pandas(frame, npartitions=8).persist()
        ddf.count().compute()
        meta = pd.DataFrame({"n": pd.Series(dtype="int64"), "sx": pd.Series(dtype="float64")})
        times = []
        for run in range(2):
            started = time.perf_counter()
            # A fresh function per run: equal graphs would share task keys, and a second run could
            # be answered from the first one's still-held results instead of shuffling again.
            fn = functools.partial(summarize_pandas, run=run)
            result = ddf.groupby("k", dropna=False).apply(fn, meta=meta, shuffle_method="p2p").compute()
            times.append(time.perf_counter() - started)
            groups = len(result)
            print(f"dask p2p run {run}: {times[-1]:.2f} s, {groups} groups, {int(result['n'].sum()):,} rows")
    return min(times)


if __name__ == "__main__":
    main()
