"""Issue 15, item 2: arrowbeat on a real Spark standalone cluster whose Workers are separate hosts.

A Master and two Workers (``tests/spark/standalone.py``): 127.0.0.2 and 127.0.0.3, one core and
1 GiB each, each with its own ``TMPDIR`` and work dir. The application's driver runs here
(client mode, on 127.0.0.1); the history tables live under the test's scratch folder, which every
host sees, while each host's temp dir is its own. One cluster and one application serve the
client-mode tests, in order: registration, shuffles across hosts, a frozen host, a killed host.
A second cluster, each Worker in its own mount namespace with its own ``/tmp``, runs an
application in ``--deploy-mode cluster``: its driver (and the RM) on a Worker host.

Deadlines are generous for a loaded 2-core machine; how fast a host's loss is noticed is measured
by ``benchmarks/cluster_faults.py``."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql import DataFrame, SparkSession

from heartbeat.admin import list_executors
from spark_plugin.jvm.launch import jar_paths
from spark_plugin.shuffle import group_apply, partition_apply, repartition, shuffle_of
from tests.procs import wait_until
from tests.spark.history_read import rows
from tests.spark.session import build_session, stop_session
from tests.spark.standalone import StandaloneCluster, Worker, private_tmp_unavailable
from tests.spark.submit import SubmittedApp

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.standalone]
INTERVAL_S, TIMEOUT_S = 0.5, 2.0
GRACE_S = 5.0
"""Beyond interval + timeout: scheduling delay of the RM's process on a loaded 2-core machine."""
WAIT_S = 90.0
ROWS = 40_000
SUMMARY = "k bigint, n bigint, sx double"
LOSS_EVENTS = {"HEARTBEAT_TIMEOUT", "UNREACHABLE", "UNREGISTERED"}
APPS = Path(__file__).parent / "apps"


def app_conf(tables: Path) -> dict[str, str]:
    return {
        "spark.arrowbeat.heartbeat.interval": f"{int(INTERVAL_S * 1000)}ms",
        "spark.arrowbeat.heartbeat.timeout": f"{int(TIMEOUT_S)}s",
        "spark.arrowbeat.tables.path": str(tables),
        "spark.arrowbeat.tables.flushInterval": "500ms",
        "spark.sql.shuffle.partitions": "8",
        "spark.arrowbeat.shuffle.adaptive": "true",
        "spark.shuffle.io.retryWait": "2s",
    }


# -- what the tests look at ----------------------------------------------------------------------
def registered(tables: Path) -> dict[str, str]:
    """Executor id -> the host it registered under (its latest registration)."""
    return {
        r["executor_id"]: r["host"]
        for r in rows(tables, "executor_events")
        if r["event"] in {"REGISTERED", "REREGISTERED"}
    }


def events_after(tables: Path, executor_id: str, after: float) -> list[dict[str, Any]]:
    return [
        r
        for r in rows(tables, "executor_events")
        if r["executor_id"] == executor_id and r["ts"].timestamp() >= after
    ]


def first_event(tables: Path, executor_id: str, kinds: set[str], after: float) -> dict[str, Any] | None:
    return next((r for r in events_after(tables, executor_id, after) if r["event"] in kinds), None)


def executor_id_of(cluster: StandaloneCluster, worker: Worker) -> str:
    """The id of the executor this Worker runs (``--executor-id N`` in its command line)."""
    (jvm,) = cluster.executors_of(worker)
    args = jvm.cmdline()
    return args[args.index("--executor-id") + 1]


def source(spark: SparkSession) -> DataFrame:
    return spark.range(0, ROWS, numPartitions=4).selectExpr(
        "id", "pmod(hash(id), 97) AS k", "cast(id % 1000 AS double) AS x"
    )


def summary(table: pa.Table) -> pa.Table:
    return pa.table(
        {
            "k": pa.array([table.column("k")[0].as_py()], pa.int64()),
            "n": pa.array([table.num_rows], pa.int64()),
            "sx": pa.array([pc.sum(table.column("x")).as_py()], pa.float64()),
        }
    )


def spark_summary(df: DataFrame) -> dict[int, tuple[int, float]]:
    return {r.k: (r.n, r.sx) for r in df.groupBy("k").applyInArrow(summary, SUMMARY).collect()}


def key_counts(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Rows per key of one reduce task's input (a key lives in exactly one task)."""
    table = pa.Table.from_batches(list(batches))
    if table.num_rows:
        counted = table.group_by("k").aggregate([("id", "count")])
        yield from counted.rename_columns(["k", "n"]).to_batches()


def check_reads_cross_hosts(out: DataFrame, workers: dict[str, Worker]) -> None:
    """Each executor's map outputs sit on its own host, in that host's own temp dir; a reduce task
    read from disk only what its own host holds and streamed (through the other host's agent)
    everything else."""
    hosts = {e: w.host for e, w in workers.items()}
    handle = shuffle_of(out)
    assert handle.persisted is not None, "an adaptive shuffle keeps its status rows"
    statuses = handle.persisted.select("reduce", "executor", "host", "path", "rows").collect()
    assert {s.executor for s in statuses} == set(hosts), statuses
    assert all(s.host == hosts[s.executor] for s in statuses), (hosts, statuses)
    for s in statuses:
        assert Path(s.path).is_relative_to(workers[s.executor].tmpdir), (s, workers[s.executor])
    reads = [r for r in handle.reports() if r["side"] == "read"]
    assert reads
    for read in reads:
        first, last = read["reducers"]
        mine = [s for s in statuses if first <= s.reduce <= last]
        local = sum(s.rows for s in mine if s.executor == read["executor"])
        remote = sum(s.rows for s in mine if s.executor != read["executor"])
        assert read["control"][0] == hosts[read["executor"]], read
        assert (read["file_bytes"] > 0) == (local > 0), (read, local)
        assert (read["streamed_bytes"] > 0) == (remote > 0), (read, remote)
        assert read["rows"] == local + remote, read
    assert sum(r["streamed_bytes"] for r in reads) > 0


# -- client mode: the driver here, executors on two hosts ----------------------------------------
@pytest.fixture(scope="class")
def cluster(scratch: Path) -> Iterator[StandaloneCluster]:
    with StandaloneCluster.start(scratch / "standalone") as cluster:
        yield cluster


@pytest.fixture(scope="class")
def tables(cluster: StandaloneCluster) -> Path:
    return cluster.root / "tables"


@pytest.fixture(scope="class")
def spark(cluster: StandaloneCluster, tables: Path, scratch: Path) -> Iterator[SparkSession]:
    spark = build_session(cluster.master_url, scratch, "test-standalone", conf=app_conf(tables))
    try:
        assert wait_until(lambda: len(registered(tables)) == 2, WAIT_S), rows(tables, "executor_events")
        yield spark
    finally:
        stop_session(spark)


@pytest.fixture(scope="class")
def workers(cluster: StandaloneCluster, spark: SparkSession) -> dict[str, Worker]:
    """Executor id -> the Worker (host) that runs it."""
    return {executor_id_of(cluster, w): w for w in cluster.workers}


@pytest.fixture(scope="class")
def hosts(workers: dict[str, Worker]) -> dict[str, str]:
    """Executor id -> the address of the host that runs it."""
    return {e: w.host for e, w in workers.items()}


class TestClientMode:
    def test_each_agent_registers_under_its_workers_host(
        self, spark: SparkSession, tables: Path, hosts: dict[str, str]
    ) -> None:
        assert sorted(hosts.values()) == ["127.0.0.2", "127.0.0.3"]
        assert registered(tables) == hosts
        conf = spark.sparkContext.getConf()
        address = conf.get("spark.arrowbeat.rm.address")
        assert address is not None and address.rsplit(":", 1)[0] == conf.get("spark.driver.host")
        seen = list_executors(address, conf.get("spark.arrowbeat.authenticate.secret") or "")
        assert {e.executor_id: e.host for e in seen if e.executor_id != "driver"} == hosts

    def test_shuffles_across_hosts_equal_sparks_own(
        self, spark: SparkSession, workers: dict[str, Worker], hosts: dict[str, str]
    ) -> None:
        df = source(spark)
        grouped = group_apply(df, ["k"], summary, SUMMARY)
        assert {r.k: (r.n, r.sx) for r in grouped.collect()} == spark_summary(df)
        check_reads_cross_hosts(grouped, workers)
        shuffle_of(grouped).release()

        moved = repartition(df, None, "k")
        assert sorted(moved.collect()) == sorted(df.collect())
        check_reads_cross_hosts(moved, workers)
        shuffle_of(moved).release()

        counted = partition_apply(df, 3, ["k"], key_counts, "k int, n bigint")
        assert dict(counted.collect()) == {r.k: r["count"] for r in df.groupBy("k").count().collect()}
        reads = [r for r in shuffle_of(counted).reports() if r["side"] == "read"]
        assert {r["control"][0] for r in reads} <= set(hosts.values())
        assert all(r["streamed_bytes"] > 0 and r["file_bytes"] > 0 for r in reads), reads
        shuffle_of(counted).release()

    def test_a_frozen_host_is_reported_alone_and_reregisters(
        self, cluster: StandaloneCluster, tables: Path, hosts: dict[str, str]
    ) -> None:
        """SIGSTOP on a Worker and everything under it: that host's executor, and only it, misses
        its heartbeats (HEARTBEAT_TIMEOUT within interval + timeout), then registers again."""
        frozen, steady = cluster.workers
        frozen_id, steady_id = executor_id_of(cluster, frozen), executor_id_of(cluster, steady)
        stopped_at = time.time()
        cluster.freeze(frozen)
        try:
            assert wait_until(lambda: first_event(tables, frozen_id, LOSS_EVENTS, stopped_at), WAIT_S)
        finally:
            cluster.thaw(frozen)
        thawed_at = time.time()
        assert wait_until(lambda: first_event(tables, frozen_id, {"REREGISTERED"}, thawed_at), WAIT_S)
        loss = first_event(tables, frozen_id, LOSS_EVENTS, stopped_at)
        assert loss is not None and loss["event"] == "HEARTBEAT_TIMEOUT", events_after(tables, frozen_id, 0)
        assert loss["host"] == frozen.host
        assert loss["ts"].timestamp() - stopped_at <= INTERVAL_S + TIMEOUT_S + GRACE_S, loss
        assert first_event(tables, steady_id, LOSS_EVENTS, stopped_at) is None, events_after(
            tables, steady_id, stopped_at
        )
        assert registered(tables) == hosts

    def test_a_host_killed_mid_shuffle_is_recomputed_on_the_other(
        self, cluster: StandaloneCluster, spark: SparkSession, tables: Path, hosts: dict[str, str]
    ) -> None:
        """SIGKILL on a Worker and everything under it after the map side ran: the reduce side
        finds that host's outputs gone, Spark recomputes those map partitions on the other host,
        the result is exact, and the killed executor's end is recorded."""
        df = source(spark)
        expected = spark_summary(df)
        out = group_apply(df, ["k"], summary, SUMMARY)  # adaptive: the map side has run
        victim = cluster.workers[0]
        victim_id = executor_id_of(cluster, victim)
        written = {r["executor"] for r in shuffle_of(out).reports() if r["side"] == "write"}
        assert victim_id in written, written
        killed_at = time.time()
        cluster.kill(victim)
        try:
            assert {r.k: (r.n, r.sx) for r in out.collect()} == expected
            handle = shuffle_of(out)
            reads = [r for r in handle.reports() if r["side"] == "read"]
            assert any(r["recomputed_maps"] for r in reads), reads
            assert all(r["executor"] != victim_id for r in reads if r["recomputed_maps"])
            handle.release()
            assert wait_until(lambda: first_event(tables, victim_id, LOSS_EVENTS, killed_at), WAIT_S)
            end = first_event(tables, victim_id, LOSS_EVENTS, killed_at)
            assert end is not None and end["host"] == victim.host, events_after(tables, victim_id, 0)
        finally:
            cluster.start_worker(victim)  # the host comes back: the rest of the class has two again
            cluster.wait_alive([victim])


# -- cluster mode: the driver on a Worker host, each host with its own /tmp ----------------------
@pytest.fixture(scope="class")
def private_cluster(scratch: Path) -> Iterator[StandaloneCluster]:
    """Two cores per Worker: the driver takes one of a Worker's, an executor the other."""
    with StandaloneCluster.start(scratch / "standalone-private", variant="private-tmp", cores=2) as cluster:
        yield cluster


def driver_output(cluster: StandaloneCluster, prefix: str) -> dict[str, Any] | None:
    """The JSON after ``prefix`` in the stdout of the driver a Worker runs (``<work dir>/driver-*/``)."""
    for worker in cluster.workers:
        for path in worker.work_dir.glob("driver-*/stdout"):
            for line in path.read_text(errors="replace").splitlines():
                if line.startswith(prefix):
                    return {"worker": worker.name, **json.loads(line[len(prefix) :])}
    return None


@pytest.mark.skipif(bool(private_tmp_unavailable()), reason=private_tmp_unavailable() or "-")
class TestClusterModePrivateTmp:
    def test_a_cluster_mode_driver_runs_its_rm_on_a_worker_host(
        self, private_cluster: StandaloneCluster, scratch: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """``--deploy-mode cluster``: the Master starts the driver on a Worker; its RM binds that
        host, an agent registers under each host (one beside the driver), the Arrow shuffle
        streams between them, and each host keeps its agents under its own ``/tmp``.

        Spark refuses a ``.py`` primary resource in standalone cluster mode, so the application
        is started as spark-submit starts any Python file: by ``org.apache.spark.deploy.PythonRunner``
        (a JVM main class), here named explicitly. A standalone driver gets the environment of
        ``spark-submit`` over its Worker's: submitted without this test run's ``SPARK_LOCAL_IP``
        and ``SPARK_LOCAL_DIRS``, it keeps its host's own (as on a real cluster)."""
        cluster = private_cluster
        monkeypatch.delenv("SPARK_LOCAL_IP")
        monkeypatch.delenv("SPARK_LOCAL_DIRS", raising=False)
        tables, go = cluster.root / "tables", cluster.root / "go"
        launcher_jar = jar_paths()[0]
        app = SubmittedApp(
            Path(launcher_jar),
            cluster.master_url,
            scratch,
            conf={
                **app_conf(tables),
                "spark.submit.deployMode": "cluster",
                "spark.standalone.submit.waitAppCompletion": "true",
                "spark.executor.cores": "1",
                "spark.cores.max": "2",
            },
            args=[str(APPS / "hold_app.py"), "", str(go), "--shuffle"],
            main_class="org.apache.spark.deploy.PythonRunner",
        )
        try:
            assert wait_until(lambda: driver_output(cluster, "APP-READY "), WAIT_S * 2), app.log_tail()
            ready = driver_output(cluster, "APP-READY ")
            assert ready is not None and ready["shuffled"] == 20_000, ready
            driver_host = next(w.host for w in cluster.workers if w.name == ready["worker"])
            assert wait_until(lambda: len(registered(tables)) == 2, WAIT_S), rows(tables, "executor_events")
            assert sorted(registered(tables).values()) == sorted(w.host for w in cluster.workers)
            assert ready["rm_address"].rsplit(":", 1)[0] == driver_host, ready
            for worker in cluster.workers:  # each host's agent announced itself in its own /tmp
                assert list(worker.private_dir.rglob("agents/*.json")), worker
            go.touch()
            assert app.wait(timeout_s=WAIT_S) == 0, app.log_tail()
            result = driver_output(cluster, "APP-RESULT ")
            assert result is not None and result["shuffled"] == 20_000, result
        finally:
            app.close()
