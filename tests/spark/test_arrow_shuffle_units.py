"""The DataFrame shuffle's pieces without Spark: map-output files, grouping, the agent's service
(staging over the real engine transport, release, TTL with an injected clock) and the reduce read."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arrow_shuffle import SchemaMismatchError, ShuffleConfigError
from arrow_shuffle.spark.agent_client import AgentInfo, MapOutputClient
from arrow_shuffle.spark.agent_service import MapOutputService
from arrow_shuffle.spark.grouping import iter_groups
from arrow_shuffle.spark.map_output import MapOutputWriter, check_keys, read_segments, route
from arrow_shuffle.spark.tasks import (
    MapOutputLostError,
    ReadStats,
    ShufflePlan,
    group_consumer,
    read_reducer,
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


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def service(tmp_path: Path) -> Any:
    svc = MapOutputService(
        "app-u", "7", SECRET, str(tmp_path / "root"), jvm_pid=4242, clock=FakeClock(1000.0)
    )
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


def test_route_is_process_independent_and_check_keys_names_the_column() -> None:
    b = batch([1, 2, None, 1])
    ids = route(b, ["k"], 4)
    assert ids[0] == ids[3] and ((ids >= 0) & (ids < 4)).all()
    with pytest.raises(ShuffleConfigError, match="'missing'"):
        check_keys(SCHEMA, ["missing"])
    with pytest.raises(ShuffleConfigError, match="'l'"):
        check_keys(pa.schema([("l", pa.list_(pa.int64()))]), ["l"])


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
        got_local = rows(read_reducer(plan, r, statuses(service, path, outs, r), local, ReadStats()))
        stats = ReadStats()
        got_remote = rows(read_reducer(plan, r, statuses(service, path, outs, r), remote_reader, stats))
        assert got_local == got_remote
        assert stats.remote_bytes > 0 or outs[r].rows == 0
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
        total += rows(read_reducer(plan, r, statuses(service, path, outs, r), neighbour, stats))
        assert stats.remote_bytes == 0 and stats.local_bytes > 0
    assert total == rows([data])
    assert service.metrics().get("shuffle_streams_staged", 0) == 0  # its agent streamed nothing
    status = statuses(service, path, outs, 0)[0]
    assert reads_from_disk(status, neighbour, host_local=True)
    assert not reads_from_disk(status, neighbour, host_local=False)
    assert not reads_from_disk(status, AgentInfo("8", "other-host", 0, 0, ""), host_local=True)
    assert not reads_from_disk({**status, "path": path + ".gone"}, neighbour, host_local=True)
    assert reads_from_disk(status, AgentInfo("7", "other-host", 0, 0, ""), host_local=False)  # our own


def test_release_and_ttl_delete_map_outputs(service: MapOutputService) -> None:
    write_map(service, 1, 0, batch(list(range(50))), 2)
    write_map(service, 2, 0, batch(list(range(50))), 2)
    assert service.disk_bytes() > 0
    with MapOutputClient(service.control_address, SECRET, "test") as client:
        assert client.call("release", 1) > 0
    assert not (Path(service.dir) / "s1").exists() and (Path(service.dir) / "s2").exists()
    clock = service._clock
    assert isinstance(clock, FakeClock)
    clock.now = 10.0**10  # far past the TTL of the files' modification times
    assert service.sweep() > 0
    assert service.disk_bytes() == 0


def test_control_channel_refuses_a_wrong_secret(service: MapOutputService) -> None:
    with pytest.raises(Exception):  # noqa: B017 - multiprocessing's ShuffleAuthenticationError or EOF
        MapOutputClient(service.control_address, "not-the-secret-at-all", "test").call("metrics")


def test_lost_agent_fails_the_read_naming_executor_and_maps(service: MapOutputService) -> None:
    path, outs, _ = write_map(service, 4, 0, batch(list(range(100))), 1)
    plan = ShufflePlan("app-u", 4, service.root, SECRET, ("k",), 1, SCHEMA.serialize().to_pybytes(), (0,))
    status = statuses(service, path, outs, 0)
    service.close()
    with pytest.raises(MapOutputLostError, match=r"map outputs \[0\] on lost executor 7"):
        list(read_reducer(plan, 0, status, AgentInfo("8", "127.0.0.1", 0, 0, ""), ReadStats()))


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
