"""A real Spark Connect server (``SparkConnectServer`` from the pip package, under spark-submit, as
a process this module owns) with arrowbeat on, on ``local-cluster[2,1,1024]``: its executors'
agents register and the RM lists them, and the shuffle API works from a Connect client (no py4j
in this process) with results equal to Spark's own, or refuses at call time.

The operator sets the secret in a properties file, as the docs advise: the test can then ask the
RM itself, while the Connect client is shown no secret (Spark withholds redacted keys from it)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from arrow_shuffle.errors import ShuffleConfigError
from harness.history_read import events, rows
from harness.procs import APP_MARKER, end, ours, wait_until
from heartbeat.rm.admin import list_executors
from spark_plugin.compat.connect import is_connect
from spark_plugin.jvm.launch import spark_settings
from spark_plugin.shuffle import group_apply, map_in_arrow, partition_apply, repartition, shuffle_of
from spark_plugin.shuffle.driver.session import STAGE_IDS_FROM
from spark_plugin.shuffle.worker.agent_client import MapOutputClient

pytestmark = (
    pytest.mark.spark
)  # one Connect server, in the primary cell (every call's pyspark code is the same)

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
SECRET = "connect-test-secret-" + uuid.uuid4().hex
START_S = 240.0
SCHEMA = "id long, k int, v long"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def connect_jar() -> Path:
    """The Spark Connect server's jar, which the pip package carries in ``pyspark/jars``."""
    import pyspark

    found = sorted((Path(pyspark.__file__).parent / "jars").glob("spark-connect_2.13-*.jar"))
    assert found, "this pyspark ships no spark-connect jar"
    return found[0]


class ConnectServer:
    """``spark-submit --class SparkConnectServer`` as a child of this process (not daemonised)."""

    def __init__(self, scratch: Path) -> None:
        self.marker = uuid.uuid4().hex
        self.port = free_port()
        self.tables = scratch / "connect-tables"
        self.shuffle_dir = scratch / "connect-shuffle"
        self.log_path = scratch / f"connect-server-{self.marker[:8]}.log"
        properties = scratch / f"connect-{self.marker[:8]}.properties"
        fd = os.open(properties, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:  # the secret never on a command line
            f.write(f"spark.arrowbeat.authenticate.secret {SECRET}\n")
        conf = dict(spark_settings(delta=False))
        conf.update(
            {
                "spark.connect.grpc.binding.address": "127.0.0.1",
                "spark.connect.grpc.binding.port": str(self.port),
                "spark.driver.memory": "768m",
                "spark.executor.memory": "512m",
                "spark.ui.enabled": "false",
                "spark.sql.shuffle.partitions": "8",
                "spark.sql.warehouse.dir": str(scratch / "connect-warehouse"),
                "spark.driver.extraJavaOptions": f"-Dderby.system.home={scratch / 'connect-derby'}",
                "spark.arrowbeat.tables.path": str(self.tables),
                "spark.arrowbeat.tables.flushInterval": "500ms",
                "spark.arrowbeat.shuffle.dir": str(self.shuffle_dir),
            }
        )
        command = [
            str(Path(sys.executable).parent / "spark-submit"),
            "--master",
            "local-cluster[2,1,1024]",
            "--properties-file",
            str(properties),
            "--class",
            SERVER_CLASS,
            "--name",
            "arrowbeat-connect-test",
        ]
        for key, value in conf.items():
            command += ["--conf", f"{key}={value}"]
        # No primary resource: spark-submit knows this class needs none (start-connect-server.sh
        # passes none either). The jar itself is on the pip package's class path already.
        env = {k: v for k, v in os.environ.items() if k not in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE")}
        env[APP_MARKER] = self.marker
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, env=env
        )

    def log_tail(self, lines: int = 40) -> str:
        self._log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def answers(self) -> bool:
        assert self.proc.poll() is None, f"the Connect server exited:\n{self.log_tail()}"
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1.0):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        """SIGTERM (Spark stops its context: plugin, agents, executors), then whatever is left."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        wait_until(lambda: not ours(app=self.marker), 30)
        end(ours(app=self.marker))
        self._log.close()


@pytest.fixture(scope="module")
def server(scratch: Path) -> Iterator[ConnectServer]:
    assert connect_jar().is_file()
    started = ConnectServer(scratch)
    try:
        assert wait_until(started.answers, START_S, interval_s=0.5), started.log_tail()
        yield started
    finally:
        started.stop()
    assert not ours(app=started.marker), [p.cmdline() for p in ours(app=started.marker)]


@pytest.fixture(scope="module")
def spark(server: ConnectServer) -> Iterator[Any]:
    """A Spark Connect client session. PySpark marks the whole process as Connect mode in
    ``os.environ`` (``SPARK_CONNECT_MODE_ENABLED``): restored afterwards, or later modules'
    classic sessions would build Connect columns."""
    from pyspark.sql import SparkSession

    saved = {k: os.environ.get(k) for k in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE")}
    session = SparkSession.builder.remote(f"sc://127.0.0.1:{server.port}").getOrCreate()
    try:
        yield session
    finally:
        session.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="module")
def data(spark: Any) -> Any:
    return spark.range(0, 30_000, numPartitions=4).selectExpr("id", "pmod(hash(id), 23) AS k", "id * 2 AS v")


def summarize(group: pa.Table) -> pa.Table:
    """One row per key group: its key, size and sum (module level: pickled by reference)."""
    return pa.table(
        {
            "k": pa.array([group.column("k")[0].as_py()], pa.int32()),
            "n": pa.array([group.num_rows], pa.int64()),
            "total": pa.array([pc.sum(group.column("v")).as_py()], pa.int64()),
        }
    )


def count_keys(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """One row per key in this reduce partition: a key seen by two calls would be two rows."""
    counts: Counter[int] = Counter()
    for batch in batches:
        counts.update(batch.column("k").to_pylist())
    keys = sorted(counts)
    yield pa.record_batch(
        [pa.array(keys, pa.int32()), pa.array([counts[k] for k in keys], pa.int64())], names=["k", "n"]
    )


def doubled(batches: Any) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        yield pa.record_batch(
            [batch.column(0), batch.column(1), pc.multiply(batch.column(2), 2)], names=["id", "k", "v"]
        )


def test_the_servers_executors_register_and_the_rm_lists_them(server: ConnectServer, spark: Any) -> None:
    assert is_connect(spark) and not hasattr(spark, "_jsc")
    assert spark.conf.get("spark.arrowbeat.authenticate.secret", None) is None  # withheld from clients
    rm = spark.conf.get("spark.arrowbeat.rm.address")

    def running() -> list[str]:
        return sorted(e.executor_id for e in list_executors(rm, SECRET) if e.state == "RUNNING")

    assert wait_until(lambda: running() == ["0", "1"], 120), running()
    assert len(ours("spark_plugin.processes.executor", server.marker)) == 2
    assert len(ours("spark_plugin.processes.driver", server.marker)) == 1

    def registered() -> set[str]:
        return {e for e, kind in events(server.tables) if kind == "REGISTERED"}

    assert wait_until(lambda: registered() == {"0", "1"}, 60), registered()


def test_group_apply_equals_sparks_aggregation(spark: Any, data: Any) -> None:
    from pyspark.sql import functions as F

    out = group_apply(data, ["k"], summarize, "k int, n long, total long")
    with shuffle_of(out) as handle:
        got = sorted(tuple(r) for r in out.collect())
        writes = [r for r in handle.reports() if r["side"] == "write"]
    expected = sorted(
        tuple(r) for r in data.groupBy("k").agg(F.count("*").alias("n"), F.sum("v").alias("total")).collect()
    )
    assert got == expected and len(got) == 23
    assert handle.shuffle_id >= STAGE_IDS_FROM  # never one of Spark's own shuffle ids
    # The map side's reports came back as its status rows: one per map partition, every row once.
    assert sorted(r["partition"] for r in writes) == [0, 1, 2, 3]
    assert sum(r["rows"] for r in writes) == 30_000


def test_partition_apply_sees_each_key_in_one_partition(spark: Any, data: Any) -> None:
    out = partition_apply(data, 5, ["k"], count_keys, "k int, n long")
    with shuffle_of(out):
        got = [tuple(r) for r in out.collect()]
    assert len({k for k, _ in got}) == len(got), "a key was split over two reduce partitions"
    assert dict(got) == {r["k"]: r["count"] for r in data.groupBy("k").count().collect()}


def test_repartition_keeps_every_row_and_releases_inside_the_cluster(
    server: ConnectServer, spark: Any, data: Any
) -> None:
    from pyspark.sql import functions as F

    out = repartition(data, 3, "k")
    handle = shuffle_of(out)
    assert Counter(tuple(r) for r in out.collect()) == Counter(tuple(r) for r in data.collect())
    placed = out.select("k", F.spark_partition_id().alias("p")).distinct().groupBy("k").count()
    assert {r["count"] for r in placed.collect()} == {1}
    folders = list(server.shuffle_dir.rglob(f"s{handle.shuffle_id}"))
    assert folders, "map outputs were written in the agents' folders"
    freed = handle.release()  # one task inside the cluster, keyed by its own agent
    assert freed > 0
    assert not [f for f in folders if f.exists()]
    written = [r for r in rows(server.tables, "shuffle_metrics") if r["shuffle_id"] == handle.shuffle_id]
    assert sorted(r["partition"] for r in written if r["side"] == "write") == [0, 1, 2, 3]


def streams_staged(agents: set[tuple[str, int]]) -> float:
    """Streams the agents staged for readers on other executors, so far."""
    total = 0.0
    for host, port in sorted(agents):
        with MapOutputClient((host, port), SECRET, f"agent {host}:{port}") as client:
            total += float(client.metrics()["shuffle_streams_staged"])
    return total


def test_reduce_tasks_stream_with_the_secret_their_own_agent_hands_them(spark: Any) -> None:
    """The plan carries no secret (the client never saw it): a reducer streaming another
    executor's map outputs authenticated with the one its agent handed it."""
    key = "spark.arrowbeat.shuffle.readHostLocalDisk"
    spark.conf.set(key, "false")  # settable per query: every other executor's output streams
    try:
        df = spark.range(0, 20_000, numPartitions=8).selectExpr("id", "pmod(hash(id), 13) AS k")
        out = repartition(df, 4, "k")
        with shuffle_of(out) as handle:
            assert handle.plan.secret == ""
            before = streams_staged(handle.agents())
            assert Counter(tuple(r) for r in out.collect()) == Counter(tuple(r) for r in df.collect())
            assert streams_staged(handle.agents()) > before
    finally:
        spark.conf.unset(key)


def test_a_chained_map_in_arrow_runs_in_the_map_task(spark: Any, data: Any) -> None:
    source = map_in_arrow(data, doubled, SCHEMA)
    out = repartition(source, 3, "k")
    with shuffle_of(out) as first, shuffle_of(repartition(data, 2, "k")) as second:
        got = Counter(tuple(r) for r in out.collect())
        assert first.shuffle_id != second.shuffle_id
    assert got == Counter(tuple(r) for r in data.mapInArrow(doubled, SCHEMA).collect())


def test_pipelined_mode_is_refused_when_called(spark: Any, data: Any) -> None:
    for call in (
        lambda: repartition(data, 2, "k", mode="pipelined"),
        lambda: group_apply(data, ["k"], summarize, "k int, n long, total long", 2, mode="pipelined"),
        lambda: partition_apply(data, 2, ["k"], count_keys, "k int, n long", mode="pipelined"),
    ):
        with pytest.raises(
            ShuffleConfigError, match=r"not supported from a Spark Connect session.*materialized"
        ):
            call()
