"""The DataFrame shuffle's pieces without Spark: map-output files, grouping, the agent's
``MapOutputService`` (staging over the real engine transport, release, TTL on a ``ManualClock``),
agent discovery and the rendezvous (deadlines on a ``ManualClock``), the reduce read, and the
driver's settings and modes (a fake session: settings come through ``spark_plugin.settings.config``)."""

from __future__ import annotations

import json
import os
import re
import threading
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arrow_shuffle import (
    ControlRequestError,
    MapOutputLostError,
    SchemaMismatchError,
    ShuffleAuthenticationError,
    ShuffleConfigError,
    ShuffleError,
)
from arrow_shuffle.checksum import CHUNK_BYTES
from arrowbeat_base.clock import ManualClock
from harness.procs import wait_until
from spark_plugin.errors import ConfigError
from spark_plugin.shuffle.agent.service import MapOutputService
from spark_plugin.shuffle.driver import shuffle_settings
from spark_plugin.shuffle.map_output import BATCH_ROWS, MapOutputWriter, check_keys, read_segments, route
from spark_plugin.shuffle.plan import ShufflePlan
from spark_plugin.shuffle.worker.agent_client import AgentInfo, MapOutputClient, find_agent
from spark_plugin.shuffle.worker.grouping import iter_groups
from spark_plugin.shuffle.worker.reduce_task import (
    ReadStats,
    group_consumer,
    read_partitions,
    reads_from_disk,
)

SECRET = "unit-test-secret-0123456789"
SCHEMA = pa.schema([("k", pa.int64()), ("s", pa.string()), ("x", pa.float64())])


def batch(keys: list[int | None], start: int = 0) -> pa.RecordBatch:
    n = len(keys)
    return pa.record_batch(
        [
            pa.array(keys, pa.int64()),
            pa.array([None if i % 5 == 0 else f"s{i % 3}" for i in range(start, start + n)]),
            pa.array([float(i) for i in range(start, start + n)]),
        ],
        schema=SCHEMA,
    )


def rows(batches: Any) -> Counter[tuple[Any, ...]]:
    found: Counter[tuple[Any, ...]] = Counter()
    for b in batches:
        for r in b.to_pylist():
            found[tuple(r.values())] += 1
    return found


@pytest.fixture
def clock() -> ManualClock:
    """Its wall reading starts at the real time: map-output files get real modification times."""
    return ManualClock(start=1000.0, wall_start=time.time())


@pytest.fixture
def service(tmp_path: Path, clock: ManualClock) -> Any:
    svc = MapOutputService("app-u", "7", SECRET, str(tmp_path / "root"), jvm_pid=4242, clock=clock)
    yield svc
    svc.close()


def write_map(
    svc: MapOutputService, shuffle: int, m: int, b: pa.RecordBatch, n: int, memory: int = 1 << 30
) -> Any:
    path = str(Path(svc.dir) / f"s{shuffle}" / f"m{m}.arrows")
    writer = MapOutputWriter(path, SCHEMA, ["k"], n, memory)
    for piece in b.to_batches(max_chunksize=7) if isinstance(b, pa.Table) else [b]:
        writer.write(piece)
    return path, writer.finish(), writer.spill_bytes


def statuses(
    svc: MapOutputService, path: str, outs: Any, reducer: int, executor: str = "7"
) -> list[dict[str, Any]]:
    host, data = svc.data_address
    return [
        {
            "map": 0,
            "attempt": "3.1.0",
            "executor": executor,
            "host": host,
            "data_port": data,
            "control_port": svc.control_address[1],
            "path": path,
            "segments": json.dumps(outs[reducer].segments),
            "bytes": outs[reducer].bytes,
        }
    ]


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.one_of(st.none(), st.integers(-5, 40)), max_size=300), st.integers(1, 9), st.integers(1, 4)
)
def test_map_output_keeps_every_row_once_and_routes_each_key_to_one_reducer(
    tmp_path_factory: pytest.TempPathFactory, keys: list[int | None], n: int, memory_kb: int
) -> None:
    folder = tmp_path_factory.mktemp("map")
    data = pa.Table.from_batches([batch(keys)], schema=SCHEMA)
    writer = MapOutputWriter(str(folder / "m.arrows"), SCHEMA, ["k"], n, memory_kb * 1024)
    for piece in data.to_batches(max_chunksize=13):
        writer.write(piece)
    outs = writer.finish()
    got: Counter[tuple[Any, ...]] = Counter()
    owner: dict[Any, int] = {}
    for r, out in enumerate(outs):
        part = list(read_segments(str(folder / "m.arrows"), out.segments))
        assert sum(b.num_rows for b in part) == out.rows
        for row in rows(part):
            assert owner.setdefault(row[0], r) == r
        got += rows(part)
    assert got == rows(data.to_batches())


def test_memory_bound_writes_several_runs(tmp_path: Path) -> None:
    b = batch(list(range(2000)))
    writer = MapOutputWriter(str(tmp_path / "m.arrows"), SCHEMA, ["k"], 3, 4096)
    for piece in pa.Table.from_batches([b]).to_batches(max_chunksize=100):
        writer.write(piece)
    outs = writer.finish()
    assert writer.spill_bytes > 0 and max(len(o.segments) for o in outs) > 1
    assert sum(o.rows for o in outs) == 2000


WIDE = pa.schema([("k", pa.int64())] + [(f"c{i}", pa.int64()) for i in range(7)])
COUNTING_POOL = {kind: pa.proxy_memory_pool(pa.default_memory_pool()) for kind in ("uniform", "one hot key")}
"""A pool per case that counts its own peak, at module level: a buffer that outlived its proxy pool
(kept by a traceback, say) would crash the interpreter when freed."""


def wide_batches(keys: np.ndarray, rows_per_batch: int = 10_000) -> list[pa.RecordBatch]:
    """Eight int64 columns (the key first, then the row number seven times), as Spark hands a
    Python worker its input: batches of ``rows_per_batch`` rows."""
    numbers = np.arange(len(keys), dtype=np.int64)
    table = pa.table([pa.array(keys)] + [pa.array(numbers)] * 7, schema=WIDE)
    batches: list[pa.RecordBatch] = table.to_batches(max_chunksize=rows_per_batch)
    return batches


@pytest.mark.parametrize("keys", ["uniform", "one hot key"])
def test_a_run_is_sorted_a_piece_at_a_time_beside_the_held_rows(tmp_path: Path, keys: str) -> None:
    """A run's reducer-ordered copy is a piece of the run (``RUN_PIECES``), not all of it, also
    when one key holds every row: the map task's Python worker stays within Spark's memory. The
    run's rows come back whole, each reducer in one segment, in the order they were written."""
    rng = np.random.default_rng(7)
    n = 200_000
    data = rng.integers(0, 1 << 40, n) if keys == "uniform" else np.full(n, 42, dtype=np.int64)
    batches = wide_batches(data)
    held = sum(b.nbytes for b in batches)
    pool = COUNTING_POOL[keys]
    path = str(tmp_path / "m.arrows")
    writer = MapOutputWriter(path, WIDE, ["k"], 7, 1 << 40, memory_pool=pool)  # one run, at finish
    for b in batches:
        writer.write(b)
    outs = writer.finish()
    # The copy is a quarter of the run plus one column gathered for the take: at most 3/8 of it.
    assert pool.max_memory() <= 0.45 * held, (pool.max_memory(), held)
    assert sum(o.rows for o in outs) == n
    reducers = np.asarray(route(pa.table([pa.array(data)], names=["k"]).to_batches()[0], ["k"], 7))
    for r, out in enumerate(outs):
        assert len(out.segments) == (1 if out.rows else 0)
        got = list(read_segments(path, out.segments))
        assert all(b.num_rows <= BATCH_ROWS for b in got) and out.batches == len(got)
        numbers = np.concatenate([b.column("c3").to_numpy() for b in got]) if got else np.array([])
        assert np.array_equal(numbers, np.flatnonzero(reducers == r))  # every row once, in order


READ_POOL = pa.proxy_memory_pool(pa.default_memory_pool())
"""Counts what ``read_segments`` allocates (module level, as ``COUNTING_POOL``)."""


def test_a_reader_holds_one_batch_of_a_hot_reducer_not_the_file(tmp_path: Path) -> None:
    """A reducer holding a hot key reads its share of a map output (several runs) a batch at a
    time: nothing of the file stays mapped into the reader, and what it holds at any time is the
    batch in hand, less than one segment, not everything it has read. A segment whose recorded
    length is wrong is an error, and no batch past its end is handed out."""
    n = 200_000
    batches = wide_batches(np.full(n, 42, dtype=np.int64))
    path = str(tmp_path / "m.arrows")
    writer = MapOutputWriter(path, WIDE, ["k"], 7, 2 << 20)  # 12.8 MB of rows: about 7 runs
    for b in batches:
        writer.write(b)
    hot = max(writer.finish(), key=lambda o: o.rows)
    lengths = [length for _, length, _ in hot.segments]
    assert hot.rows == n and len(lengths) >= 5
    one_batch = BATCH_ROWS * 8 * len(WIDE)
    unchecked = [(offset, length) for offset, length, _ in hot.segments]
    rows, held = 0, 0
    for got in read_segments(path, unchecked, memory_pool=READ_POOL):
        rows += got.num_rows
        held = max(held, READ_POOL.bytes_allocated())
        with open("/proc/self/maps", encoding="utf-8") as maps:
            assert path not in maps.read()
        del got
    assert rows == n
    assert 0 < held <= 1.25 * one_batch < max(lengths), (held, one_batch, lengths)
    assert READ_POOL.bytes_allocated() == 0  # all of it freed with the batches
    (offset, length, _), *_ = hot.segments
    short = [(offset, length // 2)]
    seen: list[int] = []
    with pytest.raises(ShuffleError, match="corrupt"):
        seen.extend(b.num_rows for b in read_segments(path, short))
    assert sum(seen) < BATCH_ROWS * length / 2 / one_batch + 1
    with open(path, "r+b") as damaged:  # garbage over the segment's first message header
        damaged.seek(offset)
        damaged.write(b"A" * 16)
    with pytest.raises(ShuffleError, match="corrupt"):
        list(read_segments(path, [(offset, length)]))


def test_a_verified_reader_holds_a_chunk_and_a_batch_not_the_segment(tmp_path: Path) -> None:
    """Checksummed segments are verified a chunk at a time before Arrow reads them: the reader
    holds the chunk and the batch in hand (Python bytes, seen by tracemalloc), far less than one
    segment of a hot reducer (about the map task's run, here 8 MiB)."""
    n = 1_000_000
    path = str(tmp_path / "m.arrows")
    writer = MapOutputWriter(path, WIDE, ["k"], 3, 8 << 20)
    for b in wide_batches(np.full(n, 42, dtype=np.int64)):
        writer.write(b)
    hot = max(writer.finish(), key=lambda o: o.rows)
    assert all(len(crcs) == -(-length // CHUNK_BYTES) for _, length, crcs in hot.segments)
    rows = 0
    tracemalloc.start()
    try:
        for got in read_segments(path, hot.segments):
            rows += got.num_rows
            del got
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    one_batch = BATCH_ROWS * 8 * len(WIDE)
    lengths = [length for _, length, _ in hot.segments]
    assert rows == n
    assert peak <= 2 * CHUNK_BYTES + 1.5 * one_batch < 0.5 * max(lengths), (peak, one_batch, lengths)


def test_route_is_process_independent_and_check_keys_names_the_column() -> None:
    b = batch([1, 2, None, 1])
    ids = route(b, ["k"], 4)
    assert ids[0] == ids[3] and ((ids >= 0) & (ids < 4)).all()
    with pytest.raises(ShuffleConfigError, match="'missing'"):
        check_keys(SCHEMA, ["missing"])
    with pytest.raises(ShuffleConfigError, match="'l'"):
        check_keys(pa.schema([("l", pa.month_day_nano_interval())]), ["l"])  # no Spark type maps to it


def test_groups_put_nulls_together_and_nans_together() -> None:
    table = pa.table(
        {
            "k": pa.array([3, None, 1, 3, None, 1], pa.int64()),
            "f": pa.array([float("nan"), 1.0, float("nan"), float("nan"), 1.0, 2.0]),
        }
    )
    groups = [g.to_pylist() for g in iter_groups(table, ["k", "f"])]
    sizes = sorted(len(g) for g in groups)
    assert sizes == [1, 1, 2, 2]
    assert sum(sizes) == table.num_rows


def test_a_table_of_one_group_is_handed_over_without_a_copy() -> None:
    """One key group (a one-key spill bucket, a partition of one key): the stable sort would leave
    every row in place, so the group is the table itself, rows in arrival order."""
    table = pa.Table.from_batches(
        [pa.record_batch({"k": pa.array([7] * 3), "v": pa.array([i, i + 1, i + 2])}) for i in (0, 3)]
    )
    [group] = list(iter_groups(table, ["k"]))
    assert group.column("v").to_pylist() == [0, 1, 2, 3, 4, 5]
    assert [c.buffers()[1].address for c in group.column("v").chunks] == [
        c.buffers()[1].address for c in table.column("v").chunks
    ]
    two = pa.table({"k": pa.array([2, 1, 2]), "v": pa.array([0, 1, 2])})
    assert [g.column("v").to_pylist() for g in iter_groups(two, ["k"])] == [[1], [0, 2]]


def test_group_consumer_rejects_a_wrong_schema_naming_group_and_partition() -> None:
    out = pa.schema([("k", pa.int64())])
    consume = group_consumer(lambda t: pa.table({"k": pa.array(["x"])}), ["k"], SCHEMA, out)
    with pytest.raises(SchemaMismatchError, match=r"key group \{'k': 1\} of partition 5"):
        list(consume(5, iter([batch([1, 1])])))


def test_remote_read_through_the_agent_and_local_read_agree(service: MapOutputService) -> None:
    data = batch([i % 11 for i in range(500)])
    path, outs, _ = write_map(service, 9, 0, data, 3)
    plan = ShufflePlan(
        "app-u",
        9,
        service.root,
        SECRET,
        ("k",),
        3,
        SCHEMA.serialize().to_pybytes(),
        (0, 1, 2),
        read_host_local=False,
    )
    local = AgentInfo("7", "127.0.0.1", 0, 0, service.dir)
    remote_reader = AgentInfo("8", "127.0.0.1", 0, 0, "")
    total: Counter[tuple[Any, ...]] = Counter()
    for r in range(3):
        got_local = rows(read_partitions(plan, {r: statuses(service, path, outs, r)}, local, ReadStats()))
        stats = ReadStats()
        got_remote = rows(read_partitions(plan, {r: statuses(service, path, outs, r)}, remote_reader, stats))
        assert got_local == got_remote
        assert stats.streamed_bytes > 0 or outs[r].rows == 0
        total += got_remote
    assert total == rows([data])
    assert service.metrics()["shuffle_streams_open"] == 0  # every staged stream was unstaged


def test_host_local_reads_take_other_executors_outputs_from_disk(service: MapOutputService) -> None:
    data = batch([i % 13 for i in range(400)])
    path, outs, _ = write_map(service, 5, 0, data, 2)
    plan = ShufflePlan("app-u", 5, service.root, SECRET, ("k",), 2, SCHEMA.serialize().to_pybytes(), (0, 1))
    neighbour = AgentInfo("8", "127.0.0.1", 0, 0, "")  # another executor on the same host
    total: Counter[tuple[Any, ...]] = Counter()
    for r in range(2):
        stats = ReadStats()
        total += rows(read_partitions(plan, {r: statuses(service, path, outs, r)}, neighbour, stats))
        assert stats.streamed_bytes == 0 and stats.file_bytes > 0
    assert total == rows([data])
    assert service.metrics().get("shuffle_streams_staged", 0) == 0  # its agent streamed nothing
    status = statuses(service, path, outs, 0)[0]
    assert reads_from_disk(status, neighbour, host_local=True)
    assert not reads_from_disk(status, neighbour, host_local=False)
    assert not reads_from_disk(status, AgentInfo("8", "other-host", 0, 0, ""), host_local=True)
    assert not reads_from_disk({**status, "path": path + ".gone"}, neighbour, host_local=True)
    assert reads_from_disk(status, AgentInfo("7", "other-host", 0, 0, ""), host_local=False)  # our own


def test_release_and_ttl_delete_map_outputs(service: MapOutputService, clock: ManualClock) -> None:
    write_map(service, 1, 0, batch(list(range(50))), 2)
    write_map(service, 2, 0, batch(list(range(50))), 2)
    assert service.disk_bytes() > 0
    with MapOutputClient(service.control_address, SECRET, "test") as client:
        assert client.release(1) > 0
    assert not (Path(service.dir) / "s1").exists() and (Path(service.dir) / "s2").exists()
    clock.jump(service.ttl_s - 60)  # not yet: the files are younger than the TTL
    assert service.sweep() == 0 and (Path(service.dir) / "s2").exists()
    clock.jump(120)  # past the TTL of the files' modification times
    assert service.sweep() > 0
    assert service.disk_bytes() == 0


def test_control_channel_refuses_a_wrong_secret(service: MapOutputService) -> None:
    with pytest.raises(ShuffleAuthenticationError, match=r"refused the handshake.*wrong secret"):
        MapOutputClient(service.control_address, "not-the-secret-at-all", "test")
    with MapOutputClient(service.control_address, SECRET, "test") as client:  # still serving
        assert client.metrics()["shuffle_streams_open"] == 0
    assert service.control.refusals() == {"authentication": 1}


def test_control_channel_stages_unstages_and_refuses_files_outside_the_agent(
    service: MapOutputService, tmp_path: Path
) -> None:
    """The typed operations end to end: stage answers a partition id, unstage drops it, and a
    request the agent must refuse is a typed error naming the agent; the connection stays usable."""
    path, outs, _ = write_map(service, 9, 0, batch(list(range(30))), 1)
    outside = tmp_path / "elsewhere.arrow"
    outside.write_bytes(Path(path).read_bytes())
    with MapOutputClient(service.control_address, SECRET, "executor 7") as client:
        pid = client.stage(9, 0, SCHEMA, [(path, outs[0].segments)])
        assert (pid.app_id, pid.shuffle_id, pid.map_index) == ("app-u", 9, 0)
        assert client.metrics()["shuffle_streams_open"] == 1
        client.unstage(pid)
        assert client.metrics()["shuffle_streams_open"] == 0
        refused = r"agent of executor 7 at 127\.0\.0\.1:\d+ refused 'stage'"
        with pytest.raises(ControlRequestError, match=refused):
            client.stage(9, 0, SCHEMA, [(str(outside), outs[0].segments)])
        assert client.metrics()["shuffle_streams_open"] == 0  # still the same, working connection


def test_lost_agent_fails_the_read_naming_executor_and_maps(service: MapOutputService) -> None:
    path, outs, _ = write_map(service, 4, 0, batch(list(range(100))), 1)
    plan = ShufflePlan("app-u", 4, service.root, SECRET, ("k",), 1, SCHEMA.serialize().to_pybytes(), (0,))
    status = statuses(service, path, outs, 0)
    service.close()
    with pytest.raises(MapOutputLostError, match=r"map outputs \[0\] on lost executor 7"):
        list(read_partitions(plan, {0: status}, AgentInfo("8", "127.0.0.1", 0, 0, ""), ReadStats()))


def test_agent_discovery_file_points_at_the_service(service: MapOutputService) -> None:
    info = json.loads((Path(service.root) / "app-u" / "agents" / "4242.json").read_text())
    assert info["control_port"] == service.control_address[1] and info["dir"] == service.dir
    service.close()
    assert not (Path(service.root) / "app-u" / "agents" / "4242.json").exists()
    assert not Path(service.dir).exists()


def test_heartbeat_payload_carries_the_agents_buffer_pool_figures(service: MapOutputService) -> None:
    from heartbeat.payload import collect_payload

    payload = collect_payload([service.metrics])
    pool = service.pool
    assert payload.metrics["shuffle_pool_segments"] == pool.num_segments
    assert payload.metrics["shuffle_pool_used_bytes"] == 0
    write_map(service, 3, 0, batch(list(range(40))), 1)
    assert collect_payload([service.metrics]).metrics["shuffle_disk_bytes"] > 0


def test_find_agent_finds_the_agent_of_an_ancestor_process(tmp_path: Path) -> None:
    """A worker finds the agent announced under its executor JVM's pid: here, pytest's parent."""
    svc = MapOutputService("app-f", "3", SECRET, str(tmp_path), jvm_pid=os.getppid())
    try:
        found = find_agent(str(tmp_path), "app-f", wait_s=0.0)
        assert (found.executor_id, found.control_address, found.dir) == ("3", svc.control_address, svc.dir)
    finally:
        svc.close()


class WatchedClock(ManualClock):
    """A ``ManualClock`` that counts ``monotonic()`` reads, so a test knows a waiter has looked."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def monotonic(self) -> float:
        self.reads += 1
        return super().monotonic()

    def read_again(self, timeout_s: float = 30.0) -> bool:
        """Wait until the clock is read twice more: one whole turn of the waiter's loop."""
        seen = self.reads
        return wait_until(lambda: self.reads >= seen + 2, timeout_s)


def test_find_agent_gives_up_at_its_deadline_naming_where_it_looked(tmp_path: Path) -> None:
    clock = WatchedClock()
    outcome: dict[str, BaseException] = {}

    def look() -> None:
        try:
            find_agent(str(tmp_path), "app-none", wait_s=10.0, clock=clock)
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=look, daemon=True)
    thread.start()
    assert wait_until(lambda: clock.reads > 0, 30)  # its deadline is set
    clock.jump(9.0)
    assert clock.read_again()
    assert thread.is_alive()  # still waiting: its deadline is on the clock, not on wall time
    clock.jump(1.0)
    thread.join(timeout=30)
    assert not thread.is_alive()
    error = outcome["error"]
    assert isinstance(error, ShuffleConfigError)
    assert str(tmp_path / "app-none" / "agents") in str(error) and "spark.arrowbeat.shuffle.dir" in str(error)


def test_rendezvous_tells_reducers_where_maps_are_and_times_out_on_its_clock() -> None:
    from spark_plugin.shuffle import rendezvous_client
    from spark_plugin.shuffle.driver import rendezvous

    clock = WatchedClock()
    driver = rendezvous.Rendezvous(SECRET, clock=clock)
    try:
        rendezvous_client.register(driver.address, SECRET, 11, 0, "h", 1, 5)
        [found] = rendezvous_client.locate(driver.address, SECRET, 11, 1)
        assert found == {"map": 0, "host": "h", "port": 1, "token": 5}
        outcome: dict[str, BaseException] = {}

        def wait_for_two() -> None:
            try:
                rendezvous_client.locate(driver.address, SECRET, 11, 2)
            except BaseException as exc:
                outcome["error"] = exc

        thread = threading.Thread(target=wait_for_two, daemon=True)
        thread.start()
        assert wait_until(lambda: driver.waiting == 1, 30)  # the driver set its deadline
        clock.jump(59.0)
        assert clock.read_again()
        assert thread.is_alive()
        clock.jump(1.0)
        thread.join(timeout=30)
        assert not thread.is_alive()
        assert isinstance(outcome["error"], ShuffleError)
        assert "only 1 of 2 map tasks registered in time" in str(outcome["error"])
        with pytest.raises(ShuffleAuthenticationError):
            rendezvous_client.locate(driver.address, "not-the-secret-at-all", 11, 1)
        rendezvous_client.forget(driver.address, SECRET, 11)
        assert driver.locate(11, 0, 0.0) == []
    finally:
        driver.close()


def test_materialized_is_the_mode_and_blocking_a_deprecated_alias() -> None:
    assert shuffle_settings.MODES == ("materialized", "pipelined")
    assert shuffle_settings.check_mode("materialized") == "materialized"
    assert shuffle_settings.check_mode("pipelined") == "pipelined"
    with pytest.warns(DeprecationWarning, match="mode='materialized'") as caught:
        assert shuffle_settings.check_mode("blocking", stacklevel=1) == "materialized"
    assert caught[0].filename == __file__  # points at the caller, not at arrowbeat
    with pytest.raises(ShuffleConfigError, match="mode='eager': expected one of materialized, pipelined"):
        shuffle_settings.check_mode("eager")


class FakeConf:
    """``SparkConf``'s and ``RuntimeConfig``'s read side, over a dict."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def getAll(self) -> list[tuple[str, str]]:
        return list(self.values.items())

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)


class FakeSession:
    """The two things ``shuffle_settings`` reads: the application's conf and the session's runtime conf."""

    def __init__(self, app: dict[str, str], runtime: dict[str, str] | None = None) -> None:
        app_conf = FakeConf(app)
        self.reads = 0

        def get_conf() -> FakeConf:
            self.reads += 1
            return app_conf

        context = {"getConf": staticmethod(get_conf), "applicationId": "app-fake"}
        self.sparkContext = type("Context", (), context)()
        self.conf = FakeConf({**app, **(runtime or {})})


def test_the_application_conf_is_read_once_per_context() -> None:
    """``getConf()`` copies every entry through py4j: one copy serves every later shuffle call of
    the application, a runtime setting is still read each time, another context reads its own."""
    app = {"spark.arrowbeat.authenticate.secret": SECRET, "spark.arrowbeat.shuffle.readHostLocalDisk": "true"}
    session = FakeSession(app)
    for _ in range(3):
        assert shuffle_settings.shuffle_settings(session).shuffle_read_host_local  # type: ignore[arg-type]
    assert session.reads == 1
    session.conf.values["spark.arrowbeat.shuffle.readHostLocalDisk"] = "false"  # per query
    assert not shuffle_settings.shuffle_settings(session).shuffle_read_host_local  # type: ignore[arg-type]
    assert session.reads == 1
    session.sparkContext.applicationId = "app-fake-2"  # a new application
    shuffle_settings.shuffle_settings(session)  # type: ignore[arg-type]
    assert session.reads == 2
    other = FakeSession({**app, "spark.arrowbeat.shuffle.mapMemory": "64m"})
    assert shuffle_settings.shuffle_settings(other).shuffle_map_memory_bytes == 64 << 20  # type: ignore[arg-type]
    assert other.reads == 1


def test_dataframe_configcome_through_the_plugins_declarations() -> None:
    app = {"spark.arrowbeat.authenticate.secret": SECRET, "spark.master": "local[2]"}
    config = shuffle_settings.shuffle_settings(FakeSession(app))  # type: ignore[arg-type]
    assert config.shuffle_map_memory_bytes == 8 << 20 and config.shuffle_read_host_local
    tuned = {**app, "spark.arrowbeat.shuffle.mapMemory": "64m", "spark.arrowbeat.shuffle.dir": "/x"}
    config = shuffle_settings.shuffle_settings(FakeSession(tuned))  # type: ignore[arg-type]
    assert (config.shuffle_map_memory_bytes, config.shuffle_dir) == (64 << 20, "/x")


def test_read_host_local_disk_is_settable_per_query_and_other_keys_are_not() -> None:
    app = {"spark.arrowbeat.authenticate.secret": SECRET, "spark.arrowbeat.shuffle.readHostLocalDisk": "true"}
    runtime = {
        "spark.arrowbeat.shuffle.readHostLocalDisk": "false",
        "spark.arrowbeat.shuffle.mapMemory": "64m",
    }
    config = shuffle_settings.shuffle_settings(FakeSession(app, runtime))  # type: ignore[arg-type]
    assert config.shuffle_read_host_local is False
    assert config.shuffle_map_memory_bytes == 8 << 20  # fixed for the application


@pytest.mark.parametrize(
    "app, runtime, named",
    [
        (
            {"spark.arrowbeat.shuffle.mapMemory": "lots"},
            {},
            "spark.arrowbeat.shuffle.mapMemory='lots': expected a size",
        ),
        (
            {},
            {"spark.arrowbeat.shuffle.readHostLocalDisk": "maybe"},
            "readHostLocalDisk='maybe': expected true or false",
        ),
        ({"spark.arrowbeat.shuffle.ttl": "0s"}, {}, "spark.arrowbeat.shuffle.ttl must be > 0"),
        ({"spark.arrowbeat.authenticate.secret": ""}, {}, "secret is unset: arrowbeat is not on"),
    ],
)
def test_a_bad_setting_is_the_plugins_config_error_naming_the_key(
    app: dict[str, str], runtime: dict[str, str], named: str
) -> None:
    session = FakeSession({"spark.arrowbeat.authenticate.secret": SECRET, **app}, runtime)
    with pytest.raises(ConfigError, match=re.escape(named)) as caught:
        shuffle_settings.shuffle_settings(session)  # type: ignore[arg-type]
    assert not isinstance(caught.value, ShuffleConfigError)


class _EffectiveConf:
    """PySpark's runtime conf: ``get(key, default)`` answers the caller's default for a key nobody
    set, ``get(key)`` this Spark's own default, and raises for a key this Spark does not define."""

    DEFAULTS: ClassVar[dict[str, str]] = {
        "spark.sql.session.timeZone": "Etc/UTC",
        "spark.sql.execution.pandas.convertToArrowArraySafely": "true",
        "spark.sql.legacy.execution.pandas.groupedMap.assignColumnsByName": "true",
        "spark.sql.execution.arrow.useLargeVarTypes": "false",
    }

    def get(self, key: str, *default: str | None) -> str | None:
        if default:
            return default[0]
        if key not in self.DEFAULTS:
            raise RuntimeError(f"[SQL_CONF_NOT_FOUND] {key}")
        return self.DEFAULTS[key]


def test_the_pandas_conversion_follows_this_sparks_effective_defaults() -> None:
    """Unset keys convert as this Spark's workers do: its JVM's zone (a timestamp result needs one
    from pyspark 4.2) and its safe-cast default; a key it lacks takes arrowbeat's default."""
    from spark_plugin.shuffle.driver.session import pandas_conversion

    session = type("Session", (), {"conf": _EffectiveConf()})()
    conversion = pandas_conversion(session)
    assert conversion.timezone == "Etc/UTC" and conversion.safecheck
    assert conversion.assign_cols_by_name and not conversion.large_var_types
    assert not conversion.prefer_int_ext_dtype and not conversion.int_to_decimal_coercion
