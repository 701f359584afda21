"""A pandas user's job end to end: Parquet in, a pandas function per key group, Parquet out.

Three engines on the same files in the same run, each timed from reading to the written output:

- Spark: ``spark.read.parquet(...).groupBy("k").applyInPandas(key_stats, SCHEMA).write.parquet``;
- arrowbeat: ``group_by(spark.read.parquet(...), "k").applyInPandas(key_stats, SCHEMA)`` (the same
  function and schema, on arrowbeat's shuffle), written the same way, its shuffle released;
- Dask: ``dd.read_parquet(...).groupby("k").apply(key_stats, shuffle_method="p2p").to_parquet``
  on a ``LocalCluster`` of 2 workers x 1 thread (needs ``pip install .[bench]``).

The input is generated once per run into the run's scratch folder: ``--files`` Parquet files of
``--rows`` rows in all, an int64 key over ``--keys`` values (``--hot F`` puts a share F of the rows
on one key), two float64 columns and an int64 one. ``key_stats`` computes per key: the count, the
mean, standard deviation and two quantiles of ``x``, the sum and maximum of ``y``, the sum of ``z``.
Every engine's output is read back and checked equal to Spark's (sorted by key, floats within a
relative 1e-9). Engines take turns in each of ``--repeat`` rounds; each one's median counts.

Printed: each engine's seconds, ratios ``RESULT e2e_vs_spark=<spark / arrowbeat>`` and
``RESULT e2e_vs_dask=<dask / arrowbeat>`` (above 1: arrowbeat is faster), the load average at the
start and the end, and where arrowbeat's time went (its map and reduce tasks' own reports; with
``--floors`` also the Parquet scan into Spark's Python workers, a pyarrow read of the same files
and the function over every group by pandas in one process, each alone). Also with ``--floors``
(``make bench`` passes it): the function's own CPU time over every group, its frames made
beforehand (one pass over fresh frames, as an engine hands them), spread evenly over the engines'
two task slots, a floor no engine's run of the job goes under (``RESULT e2e_function_floor_s``);
``e2e_floor_ratio``, arrowbeat's time over it; and
``e2e_vs_spark_ceiling`` / ``e2e_vs_dask_ceiling``, how far ahead of each arrowbeat could be if its
reading, shuffle, conversions and writing were free.

    .venv/bin/python -m benchmarks.e2e_pandas [--rows 4000000] [--files 8] [--keys 20000]
        [--hot 0.0] [--repeat 3] [--floors] [--small]
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import statistics
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA = (
    "k long, n long, x_mean double, x_std double, x_p50 double, x_p90 double, "
    "y_sum double, y_max double, z_sum long"
)
FLOATS = ("x_mean", "x_std", "x_p50", "x_p90", "y_sum", "y_max")


def key_stats(pdf: pd.DataFrame) -> pd.DataFrame:
    """Several statistics of one key's rows, written the way pandas users write them."""
    x, y = pdf["x"], pdf["y"]
    p50, p90 = x.quantile([0.5, 0.9]).to_numpy()
    return pd.DataFrame(
        {
            "k": [int(pdf["k"].iloc[0])],
            "n": [len(pdf)],
            "x_mean": [x.mean()],
            "x_std": [x.std()],
            "x_p50": [p50],
            "x_p90": [p90],
            "y_sum": [y.sum()],
            "y_max": [y.max()],
            "z_sum": [int(pdf["z"].sum())],
        }
    )


def generate(folder: Path, rows: int, files: int, keys: int, hot: float, seed: int = 7) -> list[str]:
    """``files`` Parquet files of ``rows`` rows in all (one row group per 1 M rows)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    for i, n in enumerate(np.diff(np.linspace(0, rows, files + 1).astype(np.int64))):
        k = rng.integers(0, keys, size=n, dtype=np.int64)
        if hot > 0:
            k[rng.random(n) < hot] = 0
        table = pa.table(
            {
                "k": k,
                "x": rng.normal(100.0, 15.0, size=n),
                "y": rng.random(n),
                "z": rng.integers(0, 1000, size=n, dtype=np.int64),
            }
        )
        path = folder / f"part-{i:03d}.parquet"
        pq.write_table(table, path, row_group_size=1_000_000)
        paths.append(str(path))
    return paths


def read_output(folder: Path) -> pd.DataFrame:
    """An engine's written result, sorted by key, in the declared column order."""
    files = sorted(p for p in folder.rglob("*.parquet") if not p.name.startswith((".", "_")))
    table = pa.concat_tables([pq.read_table(p) for p in files]) if files else pa.table({})
    frame = table.to_pandas()
    names = [c.split()[0] for c in SCHEMA.split(", ")]
    return frame[names].sort_values("k", kind="stable").reset_index(drop=True)


def check_equal(name: str, got: pd.DataFrame, want: pd.DataFrame) -> None:
    """``got`` equals ``want``: same keys and integer columns, floats within 1e-9 (NaN == NaN)."""
    if len(got) != len(want):
        raise AssertionError(f"{name}: {len(got)} groups, Spark {len(want)}")
    for column in ("k", "n", "z_sum"):
        if not np.array_equal(got[column].to_numpy(np.int64), want[column].to_numpy(np.int64)):
            raise AssertionError(f"{name}: column {column} differs from Spark's")
    for column in FLOATS:
        a, b = got[column].to_numpy(np.float64), want[column].to_numpy(np.float64)
        if not np.allclose(a, b, rtol=1e-9, atol=1e-9, equal_nan=True):
            worst = int(np.nanargmax(np.abs(a - b)))
            raise AssertionError(
                f"{name}: column {column} differs, e.g. key {got['k'][worst]}: {a[worst]} vs {b[worst]}"
            )


def timed(step: Callable[[], Any], times: list[float]) -> Any:
    """``step()``, its seconds appended to ``times``."""
    started = time.perf_counter()
    out = step()
    times.append(time.perf_counter() - started)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4_000_000, help="rows in all files together")
    parser.add_argument("--files", type=int, default=8, help="Parquet files of the input")
    parser.add_argument("--keys", type=int, default=20_000, help="distinct keys")
    parser.add_argument("--hot", type=float, default=0.0, help="share of the rows on one key (skew)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per engine; the median counts")
    parser.add_argument("--worker-mb", type=int, default=2048, help="M of local-cluster[2,1,M]")
    parser.add_argument(
        "--small", action="store_true", help="a quick check: 200 k rows, 4 files, 2,000 keys, 1 run"
    )
    parser.add_argument("--no-dask", action="store_true", help="skip the Dask peer")
    parser.add_argument(
        "--floors", action="store_true", help="also time the scan and the function alone (where time goes)"
    )
    args = parser.parse_args()
    if args.small:
        args.rows, args.files, args.keys, args.repeat = 200_000, 4, 2_000, 1

    from harness.env import clean_up, prepare
    from harness.session import build_session, stop_session

    scratch = prepare()  # loopback, the venv's Python everywhere, the run marker
    load_before = os.getloadavg()
    print(
        f"input: {args.rows:,} rows in {args.files} Parquet files, {args.keys:,} keys, hot share {args.hot}; "
        f"load average at the start {load_before[0]:.2f} (2 cores)",
        flush=True,
    )
    started = time.perf_counter()
    inputs = generate(scratch / "input", args.rows, args.files, args.keys, args.hot)
    size = sum(os.path.getsize(p) for p in inputs)
    print(f"generated {size / 2**20:.0f} MiB in {time.perf_counter() - started:.1f} s", flush=True)

    spark = build_session(
        f"local-cluster[2,1,{args.worker_mb}]",
        scratch,
        "e2e-pandas",
        conf={
            "spark.executor.memory": "1g",
            "spark.sql.shuffle.partitions": "200",  # Spark's default (build_session sets 4)
            "spark.ui.showConsoleProgress": "false",
            "spark.arrowbeat.shuffle.dir": str(scratch / "shuffle"),
            "spark.arrowbeat.tables.path": str(scratch / "tables"),
        },
    )
    times: dict[str, list[float]] = {"spark": [], "arrowbeat": [], "dask": []}
    stages: list[dict[str, float]] = []
    floors: dict[str, float] = {}
    dask = None if args.no_dask else _dask_engine()
    try:
        steps = _spark_steps(spark, inputs, scratch, stages)
        if dask is not None:
            steps["dask"] = lambda out: dask.run(inputs, out)
        for name, step in steps.items():  # warm-up: Python workers, imports, first-query planning
            step(scratch / f"warm-{name}")
        for run in range(args.repeat):
            for name in _rotated(list(steps), run):
                out = scratch / f"out-{name}-{run}"
                timed(functools.partial(steps[name], out), times[name])
                print(f"run {run} {name:9s} {times[name][-1]:7.2f} s", flush=True)
        want = read_output(scratch / "out-spark-0")
        for name in steps:
            if name != "spark":
                for run in range(args.repeat):
                    check_equal(f"{name} run {run}", read_output(scratch / f"out-{name}-{run}"), want)
        print(f"outputs equal: {', '.join(steps)} ({len(want):,} groups)", flush=True)
        floors = _floors(spark, inputs) if args.floors else {}
    finally:
        if dask is not None:
            dask.close()
        stop_session(spark)
        clean_up()

    load_after = os.getloadavg()
    med = {name: statistics.median(t) for name, t in times.items() if t}
    print()
    for name, seconds in med.items():
        print(f"{name:9s} median {seconds:7.2f} s  runs {', '.join(f'{t:.2f}' for t in times[name])}")
    if stages:
        print("arrowbeat, where the time went (median over runs; task seconds are summed over tasks):")
        for key in stages[0]:
            print(f"  {key:38s} {statistics.median(s[key] for s in stages):8.2f}")
    if floors:
        print("floors (each part of the job alone, once):")
        for key, seconds in floors.items():
            print(f"  {key:62s} {seconds:8.2f}")
    print(f"load average at the start {load_before[0]:.2f}, at the end {load_after[0]:.2f} (2 cores)")
    print(f"RESULT load_1m={load_before[0]:.2f}->{load_after[0]:.2f}")
    print(f"RESULT e2e_vs_spark={med['spark'] / med['arrowbeat']:.3f}")
    if "dask" in med:
        print(f"RESULT e2e_vs_dask={med['dask'] / med['arrowbeat']:.3f}")
    function_s = floors.get(FUNCTION_FLOOR)
    if function_s:
        # No engine runs the job faster than the function's own CPU over every group spread
        # evenly over its task slots (reading, shuffling and writing aside).
        floor = function_s / SLOTS
        print(f"RESULT e2e_function_floor_s={floor:.2f}")
        print(f"RESULT e2e_floor_ratio={med['arrowbeat'] / floor:.3f}")
        for name in ("spark", "dask"):
            if name in med:
                print(f"RESULT e2e_vs_{name}_ceiling={med[name] / floor:.3f}")
    return 0


def count_rows(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Every batch taken, nothing done with it but counting its rows (a scan's floor)."""
    yield pa.record_batch({"rows": pa.array([sum(b.num_rows for b in batches)], pa.int64())})


FUNCTION_FLOOR = "key_stats alone on every group (frames made beforehand), one process, CPU s"
SLOTS = 2
"""Tasks every engine here runs at once: ``local-cluster[2,1,M]``, a ``LocalCluster`` of 2 x 1."""


def _floors(spark: Any, inputs: list[str]) -> dict[str, float]:
    """Parts of the job alone: the Parquet scan into Python workers (what every arrowbeat map task
    reads through), the same files read by pyarrow in one process (what Dask reads through), and
    the function over every group by pandas in one process (no shuffle, no conversion)."""
    floors = {}
    started = time.perf_counter()
    spark.read.parquet(*inputs).mapInArrow(count_rows, "rows long").collect()
    floors["Spark's Parquet scan into Python workers (mapInArrow), wall s"] = time.perf_counter() - started
    started = time.perf_counter()
    table = pa.concat_tables([pq.read_table(p) for p in inputs])
    floors["pyarrow reads the files, one process, s"] = time.perf_counter() - started
    started = time.perf_counter()
    frame = table.to_pandas()
    floors["Arrow -> pandas, the whole input, one process, s"] = time.perf_counter() - started
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        frame.groupby("k").apply(key_stats)
    floors["key_stats on every group, pandas groupby, one process, s"] = time.perf_counter() - started
    # The function's own work and nothing else: its CPU time (steady under load, where wall time
    # is not) over frames made beforehand (groupby's split and concat are an engine's cost), in one
    # pass over fresh frames, as every engine hands them: a second pass over the same frames costs
    # a fifth to a third less (pandas caches on each frame what the function first asks of it:
    # 17.0 s, then 13.6 s; fresh frames in the same process 17.2 s again), so it is no floor.
    groups = [group.reset_index(drop=True) for _, group in frame.groupby("k")]
    started = time.process_time()
    for group in groups:
        key_stats(group)
    floors[FUNCTION_FLOOR] = time.process_time() - started
    return floors


def _rotated(names: list[str], run: int) -> list[str]:
    """Each round starts with another engine: a load change favours none."""
    shift = run % len(names)
    return names[shift:] + names[:shift]


def _spark_steps(
    spark: Any, inputs: list[str], scratch: Path, stages: list[dict[str, float]]
) -> dict[str, Callable[[Path], None]]:
    from spark_plugin.shuffle import group_by, release, shuffle_of

    def spark_step(out: Path) -> None:
        df = spark.read.parquet(*inputs)
        df.groupBy("k").applyInPandas(key_stats, SCHEMA).write.mode("overwrite").parquet(str(out))

    def arrowbeat_step(out: Path) -> None:
        started = time.perf_counter()
        df = spark.read.parquet(*inputs)
        result = group_by(df, "k").applyInPandas(key_stats, SCHEMA)  # the map side runs here
        mapped = time.perf_counter()
        try:
            result.write.mode("overwrite").parquet(str(out))
            written = time.perf_counter()
            reports = shuffle_of(result).reports()
        finally:
            release(result)
        if out.name.startswith("warm-"):
            return
        maps = [r for r in reports if r["side"] == "write"]
        reads = [r for r in reports if r["side"] == "read"]
        stages.append(
            {
                "map stage, wall s": mapped - started,
                "reduce stage + write, wall s": written - mapped,
                "release, wall s": time.perf_counter() - written,
                "map tasks (scan, to Arrow, partition), s": sum(r["seconds"] for r in maps),
                "reduce tasks (read, group, pandas), s": sum(r["seconds"] for r in reads),
                "  the slowest reduce task, s": max((r["seconds"] for r in reads), default=0.0),
                "reduce tasks blocked on the shuffle, s": sum(r["blocked_s"] for r in reads),
                "map tasks": len(maps),
                "reduce tasks": len(reads),
                "shuffled MiB": sum(r["bytes"] for r in maps) / 2**20,
            }
        )

    return {"spark": spark_step, "arrowbeat": arrowbeat_step}


class _DaskEngine:
    """A Dask ``LocalCluster`` (2 worker processes x 1 thread) and the job on it."""

    def __init__(self) -> None:
        from distributed import Client, LocalCluster

        logging.getLogger("distributed.shuffle").setLevel(logging.ERROR)  # a line per shuffle
        self.cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
        self.client = Client(self.cluster)

    def run(self, inputs: list[str], out: Path) -> None:
        import dask.dataframe as dd

        meta = pd.DataFrame(
            {
                c.split()[0]: pd.Series(dtype="int64" if c.split()[1] == "long" else "float64")
                for c in SCHEMA.split(", ")
            }
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # pandas: apply on grouping columns
            frame = dd.read_parquet(inputs)
            result = frame.groupby("k").apply(key_stats, meta=meta, shuffle_method="p2p")
            result.reset_index(drop=True).to_parquet(str(out), write_index=False)

    def close(self) -> None:
        self.client.close()
        self.cluster.close()


def _dask_engine() -> _DaskEngine | None:
    try:
        import dask.dataframe  # noqa: F401
        import distributed  # noqa: F401
    except ImportError:
        print("dask is not installed (pip install .[bench]): no Dask peer in this run")
        return None
    return _DaskEngine()


if __name__ == "__main__":
    from arrowbeat_base.hard_exit import exit_now

    code = main()
    exit_now(code)  # no interpreter finalisation: delta-rs's readers can abort it (exit 134)
