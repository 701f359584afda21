"""A real arrowbeat shuffle on ``local-cluster[2,1,1024]`` completes, correct and in about its
normal time, while 20 silent and 20 slow-drip connections are held on every agent port.

Before issue 13 a few silent connections on an agent's control port stalled such a shuffle for
more than 120 s (the accept loop ran the authentication challenge itself, with no deadline, and
the reduce tasks' control calls had none either). Host-local disk reads are off, so every map
output of the other executor streams through its agent: both its control port (stage/unstage)
and its data port (the credit-based stream) are on the path.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import DataFrame, SparkSession

from harness.procs import wait_until
from harness.session import build_session, stop_session
from spark_plugin.shuffle import group_apply, repartition, shuffle_of
from spark_plugin.shuffle.worker.agent_client import AgentInfo, announced_agents
from tests.security.attack import Siege

pytestmark = pytest.mark.spark
ROWS = 40_000


@pytest.fixture(scope="module")
def cluster(scratch: Path) -> Iterator[tuple[SparkSession, list[AgentInfo]]]:
    root = scratch / "under-attack"
    spark = build_session(
        "local-cluster[2,1,1024]",
        scratch,
        "test-shuffle-under-attack",
        conf={
            "spark.arrowbeat.shuffle.dir": str(root),
            "spark.arrowbeat.tables.path": str(scratch / "under-attack-tables"),
            "spark.sql.shuffle.partitions": "4",
            "spark.arrowbeat.shuffle.readHostLocalDisk": "false",
        },
    )
    app_id = spark.sparkContext.applicationId
    assert wait_until(lambda: len(announced_agents(str(root), app_id)) == 2, 120)
    yield spark, announced_agents(str(root), app_id)
    stop_session(spark)


def source(spark: SparkSession) -> DataFrame:
    return spark.range(0, ROWS, numPartitions=6).selectExpr(
        "id", "pmod(hash(id), 37) AS k", "concat('v', id % 101) AS s"
    )


def _count_ids(table: pa.Table) -> pa.Table:
    return table.group_by("k").aggregate([("id", "count")])


def run_shuffle(spark: SparkSession) -> tuple[float, Counter[tuple[Any, ...]], int, int]:
    """A repartition and a group_apply through the agents: seconds, rows, streamed bytes, groups."""
    started = time.monotonic()
    df = source(spark)
    out = repartition(df, 6, "k")
    with shuffle_of(out) as handle:
        rows = Counter(tuple(r) for r in out.collect())
        streamed = sum(r["streamed_bytes"] for r in handle.reports() if r["side"] == "read")
    counted = group_apply(df, ["k"], _count_ids, "k int, id_count long")
    with shuffle_of(counted):
        groups = {r.k: r.id_count for r in counted.collect()}
    assert sum(groups.values()) == ROWS and len(groups) == 37
    return time.monotonic() - started, rows, streamed, len(groups)


def test_a_shuffle_completes_while_every_agent_port_is_besieged(
    cluster: tuple[SparkSession, list[AgentInfo]],
) -> None:
    spark, agents = cluster
    want = Counter(tuple(r) for r in source(spark).collect())
    run_shuffle(spark)  # warm-up: Python workers, JIT of the plan
    normal_s, rows, streamed, _ = run_shuffle(spark)
    assert rows == want and streamed > 0  # the other executor's outputs came through its agent

    ports = [a.data_address for a in agents] + [a.control_address for a in agents]
    sieges = [Siege(address, silent=20, dripping=20, interval_s=0.5) for address in ports]
    try:
        for siege in sieges:
            siege.__enter__()
        assert all(s.wait_full() for s in sieges)
        attacked_s, rows, streamed, _ = run_shuffle(spark)
        still_on = [s.open_now() for s in sieges]
        # Each agent port cuts the besieging connections off at its handshake deadline (5 s).
        cut_off = wait_until(lambda: all(s.stats.closed_by_server >= 40 for s in sieges), 60)
    finally:
        stats = [s.stop() for s in sieges]
    print(f"shuffle: {normal_s:.1f}s normally, {attacked_s:.1f}s besieged ({len(ports)} ports x 40)")
    assert rows == want and streamed > 0
    assert all(n >= 30 for n in still_on), still_on  # the siege was on when the shuffle ended
    assert cut_off and all(s.max_open == 40 and s.refused_connect == 0 for s in stats), stats
    # ... and the shuffle took about its normal time (it used to stall for 120 s and more).
    assert attacked_s < 3 * normal_s + 15, (normal_s, attacked_s)
