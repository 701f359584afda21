"""Arrow shuffle for DataFrames on ``local-cluster[2,1,1024]``: two real executors, each with its agent.

One cluster, the run's shared ``shuffle_cluster`` (``tests/harness/apps.py``). The input has nulls,
strings, a skewed key (a third of the rows share one key), empty map partitions (a filtered range)
and, with 64 reduce partitions over ~50 keys, empty reduce partitions. Results are compared with
Spark's own operators as multisets.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.errors import PythonException
from pyspark.sql import DataFrame, SparkSession

from arrow_shuffle import ShuffleConfigError
from harness.procs import executor_jvms, wait_until
from harness.session import sql_conf
from spark_plugin.errors import ConfigError
from spark_plugin.shuffle import group_apply, partition_apply, repartition, shuffle_of
from spark_plugin.shuffle.worker.agent_client import MapOutputClient
from tests.harness.apps import SharedSession, ShuffleCluster

pytestmark = pytest.mark.spark
ROWS = 30_000


@pytest.fixture(scope="module")
def cluster(shuffle_cluster: ShuffleCluster, shared_sessions: SharedSession) -> tuple[SparkSession, Path]:
    """The run's shared ``local-cluster`` (``tests/harness/apps.py``); when it ends, its
    application's shuffle files must be gone."""
    spark, root = shuffle_cluster.spark, shuffle_cluster.root
    app_root = root / spark.sparkContext.applicationId

    def nothing_left() -> None:
        # Application end: the agents die with their executors and take the shuffle data along.
        assert wait_until(lambda: _files(app_root) == [], 30), (
            f"left after application end: {_files(app_root)}"
        )

    shared_sessions.after_stop(nothing_left)
    return spark, root


def _files(path: Path) -> list[str]:
    return [str(p) for p in path.rglob("*") if p.is_file()] if path.exists() else []


def source(spark: SparkSession, rows: int = ROWS) -> DataFrame:
    """Deterministic (recomputable) data; partitions 4 and 5 of 6 are empty after the filter."""
    return (
        spark.range(0, rows * 3 // 2, numPartitions=6)
        .filter(f"id < {rows}")
        .selectExpr(
            "id",
            "CASE WHEN id % 17 = 0 THEN NULL WHEN id % 3 = 0 THEN 7 ELSE pmod(hash(id), 50) END AS k",
            "CASE WHEN id % 11 = 0 THEN NULL ELSE concat('s', pmod(hash(id, 1), 20)) END AS s",
            "cast(pmod(hash(id, 2), 100000) AS double) / 7 AS x",
        )
    )


def multiset(df: DataFrame, cols: list[str] | None = None) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(r) for r in (df.select(*cols) if cols else df).collect())


def rows_and_placement(
    df: DataFrame, keys: list[str]
) -> tuple[Counter[tuple[Any, ...]], dict[tuple[Any, ...], set[int]]]:
    """One action: the multiset of rows, and the partitions each key value was found in."""
    rows: Counter[tuple[Any, ...]] = Counter()
    where: dict[tuple[Any, ...], set[int]] = {}
    for row in df.selectExpr("spark_partition_id() AS _p", "*").collect():
        values = row.asDict()
        rows[tuple(row[1:])] += 1
        where.setdefault(tuple(values[k] for k in keys), set()).add(row[0])
    return rows, where


@contextlib.contextmanager
def host_local(spark: SparkSession, on: bool) -> Iterator[None]:
    """``spark.arrowbeat.shuffle.readHostLocalDisk`` for the shuffles planned inside."""
    key = "spark.arrowbeat.shuffle.readHostLocalDisk"
    spark.conf.set(key, str(on).lower())
    try:
        yield
    finally:
        spark.conf.set(key, "false")


def read_paths(reports: list[dict[str, Any]]) -> tuple[int, int]:
    """Bytes the reduce tasks read by host-local file reads and through agents' streams."""
    reads = [r for r in reports if r["side"] == "read"]
    return sum(r["file_bytes"] for r in reads), sum(r["streamed_bytes"] for r in reads)


@pytest.mark.parametrize("keys, n, on_disk", [(["k"], 64, False), (["s", "k"], 7, False), (["k"], 9, True)])
def test_repartition_keeps_every_row_once_and_each_key_in_one_partition(
    cluster: tuple[SparkSession, Path], keys: list[str], n: int, on_disk: bool
) -> None:
    spark, _ = cluster
    df = source(spark)
    with host_local(spark, on_disk):
        out = repartition(df, n, *keys)
    with shuffle_of(out) as handle:
        assert out.rdd.getNumPartitions() == n
        rows, where = rows_and_placement(out, keys)
        # Usable downstream: a Spark aggregation on top of the shuffled DataFrame.
        groups = out.groupBy(*keys).count().count()
        from_files, streamed = read_paths(handle.reports())
    # Host-local reads take every map output from disk; without, the other executor's stream.
    assert from_files > 0 and (streamed == 0 if on_disk else streamed > 0)
    assert rows == multiset(df)
    assert where and all(len(parts) == 1 for parts in where.values())
    assert groups == len(where)
    if n == 64:
        assert len({p for parts in where.values() for p in parts}) < n  # empty reduce partitions


def _summary(table: pa.Table) -> pa.Table:
    """Per group: key, row count, sum of x, max id (order-independent)."""
    return pa.table(
        {
            "k": pa.array([table.column("k")[0].as_py()], pa.int32()),
            "n": pa.array([table.num_rows], pa.int64()),
            "sx": pa.array([pc.sum(table.column("x")).as_py()], pa.float64()),
            "mx": pa.array([pc.max(table.column("id")).as_py()], pa.int64()),
        }
    )


SUMMARY = "k int, n bigint, sx double, mx bigint"


def test_group_apply_equals_apply_in_arrow(cluster: tuple[SparkSession, Path]) -> None:
    spark, _ = cluster
    df = source(spark)
    ours_ = group_apply(df, ["k"], _summary, SUMMARY)
    with shuffle_of(ours_) as handle:
        got = {r.k: (r.n, round(r.sx, 6), r.mx) for r in ours_.collect()}
    assert handle.plan.hot_key_last  # a grouped call's map side puts a hot key last
    want = {
        r.k: (r.n, round(r.sx, 6), r.mx) for r in df.groupBy("k").applyInArrow(_summary, SUMMARY).collect()
    }
    assert got == want and None in got and len(got) == 51


def _tag(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for b in batches:
        yield pa.record_batch(
            {"id": b.column("id"), "s": b.column("s"), "y": pc.multiply(b.column("x"), 2.0)}
        )


def test_partition_apply_equals_repartition_map_in_arrow(cluster: tuple[SparkSession, Path]) -> None:
    spark, _ = cluster
    df = source(spark)
    schema = "id bigint, s string, y double"
    out = partition_apply(df, 6, ["s"], _tag, schema)
    with shuffle_of(out) as handle:
        got, where = rows_and_placement(out, ["s"])
    assert not handle.plan.hot_key_last  # each partition's rows in input order
    assert got == multiset(df.repartition(6, "s").mapInArrow(_tag, schema))
    assert all(len(parts) == 1 for parts in where.values())


def test_bad_input_fails_early_naming_the_column_or_partition(cluster: tuple[SparkSession, Path]) -> None:
    spark, _ = cluster
    df = source(spark, 1000)
    with pytest.raises(ShuffleConfigError, match="'nope'"):
        repartition(df, 4, "nope")
    with pytest.raises(ShuffleConfigError, match="'arr'"):  # Spark cannot group by a variant either
        repartition(df.selectExpr("id", "parse_json('1') AS arr"), 4, "arr")
    with pytest.raises(ShuffleConfigError, match="num_partitions=0"):
        repartition(df, 0, "k")
    with pytest.raises(ShuffleConfigError, match="mode"):
        repartition(df, 2, "k", mode="eager")
    with pytest.raises(ShuffleConfigError, match="task slots"):
        repartition(df, 8, "k", mode="pipelined")

    def wrong(table: pa.Table) -> pa.Table:
        return pa.table({"k": pa.array([1], pa.int64())})  # declared int, returns bigint

    bad = group_apply(df, ["k"], wrong, "k int")
    with (
        shuffle_of(bad),
        pytest.raises(
            PythonException, match=r"SchemaMismatchError: .*key group \{'k': .*\} of partition \d+"
        ),
    ):
        bad.collect()


def test_a_bad_setting_is_the_plugins_config_error(cluster: tuple[SparkSession, Path]) -> None:
    """A setting is not a call argument: ``spark_plugin``'s ``ConfigError``, naming key and form."""
    spark, _ = cluster
    df = source(spark, 1000)
    key = "spark.arrowbeat.shuffle.readHostLocalDisk"
    spark.conf.set(key, "maybe")
    try:
        with pytest.raises(ConfigError, match=f"{key}='maybe': expected true or false") as caught:
            repartition(df, 2, "k")
        assert not isinstance(caught.value, ShuffleConfigError)
    finally:
        spark.conf.set(key, "false")


def test_blocking_is_a_deprecated_name_of_materialized(cluster: tuple[SparkSession, Path]) -> None:
    spark, _ = cluster
    df = source(spark, 1000)
    with pytest.warns(DeprecationWarning, match="mode='materialized'") as caught:
        out = repartition(df, 2, "k", mode="blocking")
    ours_ = [w for w in caught if "mode='blocking' is deprecated" in str(w.message)]
    assert len(ours_) == 1 and ours_[0].filename == __file__  # points at the caller's line
    with shuffle_of(out) as handle:
        assert handle.mode == "materialized"
        assert multiset(out) == multiset(df)


def _agent_metrics(spark: SparkSession, root: Path) -> list[dict[str, float]]:
    import json

    secret = spark.sparkContext.getConf().get("spark.arrowbeat.authenticate.secret")
    assert secret
    figures = []
    for path in (root / spark.sparkContext.applicationId / "agents").glob("*.json"):
        info = json.loads(path.read_text())
        with MapOutputClient((info["host"], info["control_port"]), secret, "test") as client:
            figures.append(client.metrics())
    return figures


def test_release_returns_disk_and_memory_to_baseline(cluster: tuple[SparkSession, Path]) -> None:
    spark, root = cluster
    app_root = root / spark.sparkContext.applicationId
    before = _agent_metrics(spark, root)
    assert len(before) == 2
    used_before = sum(m["shuffle_pool_used_bytes"] for m in before)
    out = repartition(source(spark), 8, "k")
    handle = shuffle_of(out)
    assert out.count() == ROWS
    shuffle_dirs = list(app_root.glob(f"*/s{handle.shuffle_id}"))
    assert shuffle_dirs and sum(f.stat().st_size for d in shuffle_dirs for f in d.rglob("*")) > 0
    assert handle.release() > 0
    assert not list(app_root.glob(f"*/s{handle.shuffle_id}"))
    after = _agent_metrics(spark, root)
    assert sum(m["shuffle_pool_used_bytes"] for m in after) == used_before
    assert all(m["shuffle_streams_open"] == 0 for m in after)
    assert handle.release() == 0  # idempotent


def test_every_shuffle_path_is_private_while_the_outputs_are_held(cluster: tuple[SparkSession, Path]) -> None:
    """Issue 13: after a real shuffle, before release, every folder under the root is 0700 and every
    file (map outputs, discovery files) 0600, all owned by the user running the executors."""
    import stat

    spark, root = cluster
    out = repartition(source(spark), 8, "k")
    handle = shuffle_of(out)
    try:
        assert out.count() == ROWS
        app_root = root / spark.sparkContext.applicationId
        assert list(app_root.glob(f"*/s{handle.shuffle_id}/*.arrows")), "no map output is held"
        assert len(list((app_root / "agents").glob("*.json"))) == 2
        entries = [root, *root.rglob("*")]
        for path in entries:
            st = os.lstat(path)
            kind = "dir" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else "other"
            assert (kind, stat.S_IMODE(st.st_mode), st.st_uid) == (
                kind,
                0o700 if kind == "dir" else 0o600,
                os.geteuid(),
            ) and kind != "other", f"{path}: {kind} {stat.S_IMODE(st.st_mode):o} uid {st.st_uid}"
        assert len(entries) >= 8  # root, app, agents + 2 files, 2 executor folders, a shuffle folder...
    finally:
        handle.release()


FULL_RETRY_ON_MISMATCH = "spark.sql.shuffle.orderIndependentChecksum.enableFullRetryOnMismatch"


def test_executor_killed_after_map_stage_result_still_exact(
    cluster: tuple[SparkSession, Path], tmp_path: Path
) -> None:
    """Map stage done, first reduce task holds before reading; the other executor is SIGKILLed."""
    spark, _ = cluster
    df = source(spark)
    gate_dir = str(tmp_path)

    def hold_then_pass(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        marker = os.path.join(gate_dir, "holding")
        if not os.path.exists(marker):  # only the very first reduce task attempt holds
            with open(f"{marker}.tmp", "w") as f:  # whole when it appears: the test reads it at once
                f.write(str(os.getppid()))
            os.replace(f"{marker}.tmp", marker)
            deadline = time.monotonic() + 60
            while not os.path.exists(os.path.join(gate_dir, "go")) and time.monotonic() < deadline:
                time.sleep(0.05)
        yield from batches

    out = partition_apply(df, 4, ["k"], hold_then_pass, df.schema)
    handle = shuffle_of(out)
    result: dict[str, Any] = {}

    def run() -> None:
        # Spark 4.2 turns on order-independent shuffle checksums with a full retry on mismatch
        # (SPARK-54830): the recomputed map partition's status rows name its new location, so they
        # never match, and Spark aborts a result stage that already finished a task. Until the rows
        # carry no location (docs/concepts/shuffle.md, "Lost map outputs"), recomputation after a
        # finished reduce task needs the retry off; on 4.0/4.1 the key does nothing.
        try:
            with sql_conf(spark, {FULL_RETRY_ON_MISMATCH: "false"}):
                result["rows"] = multiset(out)
        except Exception as exc:  # reported by the assertion below
            result["error"] = exc

    jvms_before = executor_jvms()
    assert len(jvms_before) == 2
    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert wait_until(lambda: os.path.exists(os.path.join(gate_dir, "holding")), 120)
        # The holding task runs in a worker under one executor JVM; kill the *other* one, which
        # holds map outputs that task has not read yet.
        holder = _holding_jvm(int(Path(gate_dir, "holding").read_text()))
        victims = [p for p in jvms_before.values() if p.pid != holder]
        assert len(victims) == 1
        victims[0].send_signal(signal.SIGKILL)
    finally:
        Path(gate_dir, "go").write_text("")
        thread.join(timeout=240)
    assert "error" not in result, result.get("error")
    assert result["rows"] == multiset(df)
    reads = [r for r in handle.reports() if r["side"] == "read"]
    assert any(r["recomputed_maps"] for r in reads), reads
    handle.flush_metrics()
    tables = Path(spark.sparkContext.getConf().get("spark.arrowbeat.tables.path") or "")
    from deltalake import DeltaTable

    rows = DeltaTable(str(tables / "shuffle_metrics")).to_pyarrow_table().to_pylist()
    mine = [r for r in rows if r["shuffle_id"] == handle.shuffle_id]
    assert any(r["recomputed"] and r["side"] == "write" for r in mine)
    assert sum(r["rows"] for r in mine if r["side"] == "read") >= ROWS
    handle.release()
    # The cluster replaces the lost executor before the next module needs it.
    assert wait_until(lambda: len(executor_jvms()) == 2, 60)


def _holding_jvm(worker_parent: int) -> int:
    """The executor JVM above a Python worker's parent (the pyspark daemon)."""
    import psutil

    proc: psutil.Process | None = psutil.Process(worker_parent)
    while proc is not None and "CoarseGrainedExecutorBackend" not in " ".join(proc.cmdline()):
        proc = proc.parent()
    assert proc is not None
    return proc.pid


def test_pipelined_mode_streams_map_to_reduce_in_one_stage(
    cluster: tuple[SparkSession, Path],
) -> None:
    """Two slots: one map task and one reduce task, running at once, the map output streamed."""
    spark, _ = cluster
    df = source(spark).coalesce(1)
    schema = "id bigint, s string, y double"
    out = partition_apply(df, 1, ["s"], _tag, schema, mode="pipelined")
    # Separate map and reduce tasks: Spark 4.1+ zips a union of two single-partition children into
    # one task (spark.sql.unionOutputPartitioning), where the map task would wait on itself.
    assert out.rdd.getNumPartitions() == 2
    with shuffle_of(out):
        assert multiset(out) == multiset(df.repartition(1, "s").mapInArrow(_tag, schema))
    grouped = group_apply(df, ["k"], _summary, SUMMARY, num_partitions=1, mode="pipelined")
    with shuffle_of(grouped) as handle:
        got = {r.k: (r.n, round(r.sx, 6), r.mx) for r in grouped.collect()}
        assert sum(r["rows"] for r in handle.reports() if r["side"] == "read") == ROWS
    want = {
        r.k: (r.n, round(r.sx, 6), r.mx) for r in df.groupBy("k").applyInArrow(_summary, SUMMARY).collect()
    }
    assert got == want


def _worker_facts(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """What a worker knows of its daemon: the process's main module, this task's rank among the
    tasks of this function in this process, the GC's frozen objects, the zipimport patch."""
    import gc
    import sys
    import zipimport

    for _ in batches:
        pass
    rank = getattr(sys, "_arrowbeat_test_worker_facts", 0) + 1
    sys._arrowbeat_test_worker_facts = rank  # type: ignore[attr-defined]
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    patched = getattr(zipimport.zipimporter.invalidate_caches, "_arrowbeat_skips_unchanged", False)
    yield pa.record_batch(
        {
            "main": [getattr(spec, "name", "")],
            "pid": [os.getpid()],
            "rank": [rank],
            "frozen": [gc.get_freeze_count()],
            "patched": [bool(patched)],
        }
    )


def test_python_workers_come_from_arrowbeats_daemon(cluster: tuple[SparkSession, Path]) -> None:
    """``configure`` set ``spark.python.daemon.module``: the executors' workers are forked by
    arrowbeat's daemon and get what its shims decided for this pyspark and CPython (the driver runs
    the executors' interpreter): the zipimport patch where it cuts a per-task re-read, and a GC
    freeze, before the fork of everything a task imports where PySpark forks with threads (4.0,
    4.1), else of the thread-free part before the fork and of the rest at each worker's second
    task."""
    from pyspark import daemon as pyspark_daemon

    from spark_plugin.compat.daemon import fork_plan
    from spark_plugin.compat.zipimport_cache import find_invalidate_caches

    spark, _ = cluster
    assert (
        spark.sparkContext.getConf().get("spark.python.daemon.module") == "spark_plugin.python_worker.daemon"
    )
    zip_patch = find_invalidate_caches()
    plan = fork_plan(pyspark_daemon)
    assert not plan.reason, plan.reason  # every supported minor has its plan recorded
    # Two executors with one slot each: 8 tasks make at least one worker run several of them.
    facts = (
        spark.range(0, 8, numPartitions=8)
        .mapInArrow(_worker_facts, "main string, pid long, rank long, frozen long, patched boolean")
        .collect()
    )
    assert len(facts) == 8
    assert {r.main for r in facts} == {"spark_plugin.python_worker.daemon"}
    assert {r.patched for r in facts} == {zip_patch.original is not None}, zip_patch.reason
    full = 50_000  # pyspark, pyarrow and pandas frozen: far more objects than this
    if not plan.freeze_in_worker:  # everything preloaded and frozen before the first fork
        assert all(r.frozen > full for r in facts), facts
        return
    # Forked without threads: pyspark.worker frozen before the fork (fewer objects), the rest a
    # worker imported itself frozen at its second task.
    assert all(r.frozen > 0 for r in facts), facts
    first = {r.pid: r.frozen for r in facts if r.rank == 1}
    later = [r for r in facts if r.rank > 1]
    assert later, f"no worker ran two tasks: {facts}"
    assert all(r.frozen > full for r in later), facts
    # Never unfrozen (``gc.unfreeze`` empties the permanent generation). A frozen object can still
    # be freed by its refcount, so a later count may be a little lower: a bounded cache (``re``'s)
    # evicts frozen entries when a later task's first import of a module compiles its patterns.
    assert all(r.frozen >= 0.95 * first[r.pid] for r in later if r.pid in first), facts


def test_default_partitions_are_coalesced_by_size_and_keys_stay_whole(
    cluster: tuple[SparkSession, Path],
) -> None:
    """Issue 14, item 1: Spark's defaults (200 partitions, AQE on) give a few reduce tasks, not 200;
    contiguous reduce partitions, each key in one task, the result equal to Spark's."""
    spark, _ = cluster
    df = source(spark)
    with sql_conf(spark, {"spark.sql.shuffle.partitions": "200"}):
        out = group_apply(df, ["k"], _summary, SUMMARY)
        handle = shuffle_of(out)
        with handle:
            groups = handle.groups
            assert groups is not None and [i for g in groups for i in g] == list(range(200))
            assert len(groups) < 20  # ~1 MB of data: a handful of tasks, as AQE would pick
            assert out.rdd.getNumPartitions() == len(groups)
            got = {r.k: (r.n, round(r.sx, 6), r.mx) for r in out.collect()}
            reads = [r for r in handle.reports() if r["side"] == "read"]
            assert sorted(tuple(r["reducers"]) for r in reads) == [(g.start, g.stop - 1) for g in groups]
            repartitioned = repartition(df, None, "k")  # df.repartition("k"): coalesced too
            with shuffle_of(repartitioned) as again:
                assert again.groups is not None and len(again.groups) < 20
                placed, where = rows_and_placement(repartitioned, ["k"])
                assert placed == multiset(df)
                assert all(len(parts) == 1 for parts in where.values())
        with sql_conf(spark, {"spark.arrowbeat.shuffle.adaptive": "false"}):
            fixed = group_apply(df, ["k"], _summary, SUMMARY)
            with shuffle_of(fixed) as plain:
                assert plain.groups is None and fixed.rdd.getNumPartitions() == 200
            exact = repartition(df, 7, "k")  # an explicit count is kept exactly, as Spark keeps it
            with shuffle_of(exact) as kept:
                assert kept.groups is None and exact.rdd.getNumPartitions() == 7
    want = {
        r.k: (r.n, round(r.sx, 6), r.mx) for r in df.groupBy("k").applyInArrow(_summary, SUMMARY).collect()
    }
    assert got == want


def test_metrics_are_counted_once_however_often_a_dataframe_is_evaluated(
    cluster: tuple[SparkSession, Path],
) -> None:
    """Issue 14, item 7: one ``shuffle_metrics`` row per (side, partition, attempt)."""
    spark, _ = cluster
    df = source(spark, 5000)
    out = repartition(df, 3, "k")  # exact: the map stage reruns with every evaluation
    handle = shuffle_of(out)
    for _ in range(3):
        assert out.count() == 5000
    assert len([r for r in handle.reports() if r["side"] == "read"]) == 9  # the raw reports repeat
    written = handle.flush_metrics()
    assert written == 6 + 3  # six map partitions, three reduce partitions: once each
    assert handle.flush_metrics() == 0
    handle.release()
    tables = Path(spark.sparkContext.getConf().get("spark.arrowbeat.tables.path") or "")
    from deltalake import DeltaTable

    rows = DeltaTable(str(tables / "shuffle_metrics")).to_pyarrow_table().to_pylist()
    mine = [(r["side"], r["partition"]) for r in rows if r["shuffle_id"] == handle.shuffle_id]
    assert sorted(mine) == sorted([("write", m) for m in range(6)] + [("read", p) for p in range(3)])
    assert (
        sum(r["rows"] for r in rows if r["shuffle_id"] == handle.shuffle_id and r["side"] == "read") == 5000
    )
