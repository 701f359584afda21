"""Issue 15, item 2: arrowbeat on a real Spark standalone cluster whose Workers are separate hosts;
and issue 14, item 3: map outputs lost while their executor lives are recomputed, exactly.

A Master and two Workers (``harness/standalone.py``): 127.0.0.2 and 127.0.0.3, one core and
1 GiB each, each with its own ``TMPDIR`` and work dir. The application's driver runs here
(client mode, on 127.0.0.1); the history tables live under the test's scratch folder, which every
host sees, while each host's temp dir is its own. One cluster and one application serve the
client-mode tests, in order: registration, shuffles across hosts, a frozen host, a killed host,
then the lost outputs of a live executor (every read of the other executor's outputs streams
through its agent, as between hosts), taken away between the map side and the reduce side of an
adaptive ``group_apply``:

- the agent of one executor is SIGKILLed while its JVM lives: the JVM notices, asks the driver to
  replace the executor, and Spark recomputes that executor's map partitions;
- the map-output files of one executor are deleted while its agent lives: the reduce task that
  cannot read them tells that agent (``report_lost``), which tells its JVM, and the same follows.

Either way the result equals Spark's own ``groupBy``, the recomputed map partitions are named in
the reduce tasks' reports, and the cluster is back to two executors.

A second cluster, each Worker in its own mount namespace with its own ``/tmp``, runs an
application in ``--deploy-mode cluster``: its driver (and the RM) on a Worker host. It runs first,
and is gone before the client-mode cluster starts.

Deadlines are generous for a loaded 2-core machine; how fast a host's loss is noticed is measured
by ``benchmarks/cluster_faults.py``."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import DataFrame, SparkSession

from harness.apps import HOLD_APP
from harness.history_read import rows
from harness.procs import executor_jvms, wait_until
from harness.standalone import (
    SUMMARY,
    StandaloneApp,
    StandaloneCluster,
    Worker,
    keyed_source,
    private_tmp_unavailable,
    spark_summary,
    standalone_app,
    summary,
)
from harness.submit import SubmittedApp
from heartbeat.rm.admin import list_executors
from spark_plugin.jvm.launch import jar_paths
from spark_plugin.shuffle import group_apply, partition_apply, repartition, shuffle_of

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.standalone]
INTERVAL_S, TIMEOUT_S = 0.5, 2.0
GRACE_S = 5.0
"""Beyond interval + timeout: scheduling delay of the RM's process on a loaded 2-core machine."""
WAIT_S = 90.0
ROWS = 40_000
LOSS_EVENTS = {"HEARTBEAT_TIMEOUT", "UNREACHABLE", "UNREGISTERED"}


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


def source(spark: SparkSession) -> DataFrame:
    return keyed_source(spark, ROWS, 97)


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
            args=[str(HOLD_APP), "", str(go), "--shuffle"],
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


# -- client mode: the driver here, executors on two hosts ----------------------------------------
@pytest.fixture(scope="module")
def app(scratch: Path) -> Iterator[StandaloneApp]:
    """One cluster and one application for every client-mode test of this module."""
    root = scratch / "standalone"
    with standalone_app(root, scratch, "test-standalone", app_conf(root / "tables"), timeout_s=WAIT_S) as app:
        assert wait_until(lambda: len(registered(app.tables)) == 2, WAIT_S), rows(
            app.tables, "executor_events"
        )
        yield app


@pytest.fixture(scope="module")
def cluster(app: StandaloneApp) -> StandaloneCluster:
    return app.cluster


@pytest.fixture(scope="module")
def tables(app: StandaloneApp) -> Path:
    return app.tables


@pytest.fixture(scope="module")
def spark(app: StandaloneApp) -> SparkSession:
    return app.spark


@pytest.fixture(scope="class")
def workers(cluster: StandaloneCluster, spark: SparkSession) -> dict[str, Worker]:
    """Executor id -> the Worker (host) that runs it."""
    return {cluster.executor_id(w): w for w in cluster.workers}


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
        frozen_id, steady_id = cluster.executor_id(frozen), cluster.executor_id(steady)
        stopped_at = time.time()
        cluster.freeze(frozen)
        try:
            assert wait_until(lambda: first_event(tables, frozen_id, LOSS_EVENTS, stopped_at), WAIT_S)
        finally:
            thawed_at = cluster.thaw(frozen)  # before the SIGCONT: a re-registration may follow at once
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
        victim_id = cluster.executor_id(victim)
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


# -- lost map outputs of a live executor (issue 14, item 3), on the same application -------------
RECOMPUTE_PARTITIONS = "16"


def agents(cluster: StandaloneCluster, app_id: str) -> dict[str, dict[str, Any]]:
    """Executor id -> its agent's discovery record (pid, ports, directory), from every host's own
    temp dir (an executor's shuffle root is under its host's local dirs)."""
    found = {}
    for worker in cluster.workers:
        for path in worker.private_dir.rglob(f"{app_id}/agents/*.json"):
            info = json.loads(path.read_text())
            found[str(info["executor_id"])] = info
    return found


def executor_pids() -> set[int]:
    return {p.pid for p in executor_jvms().values()}


def map_outputs_of(info: dict[str, Any], shuffle_id: int) -> list[Path]:
    folder = Path(info["dir"]) / f"s{shuffle_id}"
    return sorted(folder.glob("*.arrows")) if folder.exists() else []


def victim_with_outputs(
    spark: SparkSession, cluster: StandaloneCluster, shuffle_id: int
) -> tuple[str, dict[str, Any]]:
    known = agents(cluster, spark.sparkContext.applicationId)
    for executor, info in sorted(known.items()):
        if map_outputs_of(info, shuffle_id):
            return executor, info
    raise AssertionError(f"no agent holds outputs of shuffle {shuffle_id}: {known}")


def agents_alive(spark: SparkSession, cluster: StandaloneCluster) -> list[str]:
    alive = []
    for executor, info in agents(cluster, spark.sparkContext.applicationId).items():
        try:
            os.kill(int(info["pid"]), 0)
        except ProcessLookupError:
            continue
        alive.append(executor)
    return alive


def check_recomputed(out: DataFrame, df: DataFrame, jvms_before: set[int]) -> None:
    got = {r.k: (r.n, r.sx) for r in out.collect()}
    assert got == spark_summary(df)
    handle = shuffle_of(out)
    reads = [r for r in handle.reports() if r["side"] == "read"]
    assert any(r["recomputed_maps"] for r in reads), reads
    handle.release()
    # Spark replaced the executor: two executors again, one of them new.
    assert wait_until(lambda: len(executor_pids()) == 2 and executor_pids() != jvms_before, WAIT_S)


class TestLostOutputsAreRecomputed:
    @pytest.fixture(autouse=True)
    def two_live_executors(self, spark: SparkSession, cluster: StandaloneCluster) -> Iterator[None]:
        """Both hosts run an executor with a live agent (a host killed or an executor replaced
        before comes back first); the reduce side has as many partitions as this class wants."""
        assert wait_until(
            lambda: len(executor_pids()) == 2 and len(agents_alive(spark, cluster)) == 2, WAIT_S
        )
        before = spark.conf.get("spark.sql.shuffle.partitions") or "200"
        spark.conf.set("spark.sql.shuffle.partitions", RECOMPUTE_PARTITIONS)
        try:
            yield
        finally:
            spark.conf.set("spark.sql.shuffle.partitions", before)

    def test_an_agent_killed_while_its_jvm_lives_gets_its_map_partitions_recomputed(
        self, spark: SparkSession, cluster: StandaloneCluster
    ) -> None:
        df = source(spark)
        jvms_before = executor_pids()
        assert len(jvms_before) == 2
        out = group_apply(df, ["k"], summary, SUMMARY)  # adaptive: the map side has run
        shuffle_id = shuffle_of(out).shuffle_id
        _, info = victim_with_outputs(spark, cluster, shuffle_id)
        os.kill(int(info["pid"]), signal.SIGKILL)
        check_recomputed(out, df, jvms_before)

    def test_map_output_files_deleted_under_a_live_agent_are_recomputed(
        self, spark: SparkSession, cluster: StandaloneCluster
    ) -> None:
        df = source(spark)
        jvms_before = executor_pids()
        out = group_apply(df, ["k"], summary, SUMMARY)
        shuffle_id = shuffle_of(out).shuffle_id
        _, info = victim_with_outputs(spark, cluster, shuffle_id)
        for path in map_outputs_of(info, shuffle_id):
            path.unlink()
        check_recomputed(out, df, jvms_before)
