"""Damaged map outputs, without Spark: every damage is caught before Arrow decodes a byte, and the
owner's agent removes the file and arranges its recompute (dropping its status rows' Spark blocks,
or replacing the executor where it cannot), whether a reduce task found it host-locally or the agent
found it serving a stream. The Spark side (a fetch failure that reruns exactly that map partition)
is ``tests/spark/test_corrupt_outputs.py``."""

from __future__ import annotations

import json
import os
import random
import struct
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from arrow_shuffle import CorruptDataError, MapOutputLostError, ShuffleError
from arrow_shuffle.checksum import CHUNK_BYTES, VerifiedSegment, digest
from spark_plugin.shuffle.agent.corrupt_outputs import Outcome
from spark_plugin.shuffle.agent.service import MapOutputService
from spark_plugin.shuffle.agent_layout import name_parts, written_by
from spark_plugin.shuffle.driver.handle import _stage
from spark_plugin.shuffle.map_output import MapOutputWriter, read_segments
from spark_plugin.shuffle.map_output_format import PREFIX_BYTES
from spark_plugin.shuffle.plan import ShufflePlan
from spark_plugin.shuffle.worker.agent_client import AgentInfo, MapOutputClient
from spark_plugin.shuffle.worker.reduce_task import ReadStats, read_partitions

SECRET = "corrupt-outputs-secret-0123456789"
SCHEMA = pa.schema([("k", pa.int64()), ("s", pa.string()), ("x", pa.float64())])
NAME = "m3-2.41.0-0a1b2c3d.arrows"
"""A map output's name as ``map_task.map_function`` makes it: map partition 3, task attempt id 41."""


def data(n: int, seed: int = 0) -> pa.RecordBatch:
    rng = random.Random(seed)
    return pa.record_batch(
        [
            pa.array([rng.randrange(997) for _ in range(n)], pa.int64()),
            pa.array([None if i % 7 == 0 else f"v{rng.randrange(50)}" for i in range(n)]),
            pa.array([rng.random() for _ in range(n)]),
        ],
        schema=SCHEMA,
    )


def write(
    path: str, reducers: int = 4, rows: int = 60_000, memory: int = 1 << 20, checksum: bool = True
) -> Any:
    writer = MapOutputWriter(path, SCHEMA, ["k"], reducers, memory, checksum=checksum)
    for piece in pa.Table.from_batches([data(rows)]).to_batches(max_chunksize=10_000):
        writer.write(piece)
    return writer.finish()


def read_all(path: str, outputs: Sequence[Any]) -> list[pa.Table]:
    return [pa.Table.from_batches(list(read_segments(path, o.segments)), schema=SCHEMA) for o in outputs]


def flip(path: str, position: int, mask: int = 0x01, length: int = 1) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        old = f.read(length)
        f.seek(position)
        f.write(bytes(b ^ mask for b in old))


def test_segments_carry_a_checksum_per_chunk_and_read_back_exactly(tmp_path: Path) -> None:
    path = str(tmp_path / "m.arrows")
    outputs = write(path, rows=200_000, memory=4 << 20)
    for o in outputs:
        for _, length, crcs in o.segments:
            assert len(crcs) == -(-length // CHUNK_BYTES) and all(0 <= c < 1 << 32 for c in crcs)
    assert any(len(crcs) > 1 for o in outputs for _, _, crcs in o.segments)  # chunks cross messages
    got = pa.concat_tables(read_all(path, outputs))
    assert got.num_rows == 200_000
    assert sorted(got.column("x").to_pylist()) == sorted(data(200_000).column("x").to_pylist())


@pytest.mark.parametrize(
    "damage",
    [
        [(0.35, 0x5A, 256), (0.60, 0x5A, 256), (0.85, 0x5A, 256)],  # 256 bytes XOR 0x5A, three places
        [(0.47, 0x01, 1)],  # one flipped bit (issue 36: crashed every reader)
    ],
    ids=["overwrites", "one-bit"],
)
def test_the_damage_users_met_is_an_error_naming_the_file_never_rows(
    tmp_path: Path, damage: list[tuple[float, int, int]]
) -> None:
    path = str(tmp_path / "m.arrows")
    outputs = write(path)
    size = os.path.getsize(path)
    for at, mask, length in damage:
        flip(path, int(size * at), mask, length)
    damaged = 0
    for o in outputs:
        try:
            list(read_segments(path, o.segments))
        except CorruptDataError as exc:
            assert path in str(exc) and "checksum mismatch" in str(exc)
            damaged += 1
    assert damaged == len({_reducer_at(outputs, int(size * at)) for at, _, _ in damage})


def _reducer_at(outputs: Sequence[Any], position: int) -> int | None:
    """The reducer whose segment holds byte ``position``; None for the file's header."""
    for r, o in enumerate(outputs):
        if any(offset <= position < offset + length for offset, length, _ in o.segments):
            return r
    assert position < min(offset for o in outputs for offset, _, _ in o.segments), position
    return None


def test_every_single_bit_flip_is_caught_and_other_segments_read_on(tmp_path: Path) -> None:
    """200 random bit flips, one at a time, anywhere in the file, and 40 in its header: the
    segment holding it is a ``CorruptDataError`` (no other exception, no batch decoded from
    damaged bytes), and every other segment still reads exactly; a damaged header (the schema
    every segment is decoded with) is a ``CorruptDataError`` for every segment."""
    path = str(tmp_path / "m.arrows")
    outputs = write(path, rows=20_000)
    pristine = Path(path).read_bytes()
    header = min(offset for o in outputs for offset, _, _ in o.segments)
    want = read_all(path, outputs)
    rng = random.Random(36)
    positions = [rng.randrange(len(pristine)) for _ in range(200)] + [
        rng.randrange(header) for _ in range(40)
    ]
    for position in positions:
        Path(path).write_bytes(pristine)
        flip(path, position, 1 << rng.randrange(8))
        hit = _reducer_at(outputs, position)
        for r, o in enumerate(outputs):
            if hit is None or r == hit:
                with pytest.raises(CorruptDataError):
                    list(read_segments(path, o.segments))
            else:
                assert pa.Table.from_batches(list(read_segments(path, o.segments)), schema=SCHEMA).equals(
                    want[r]
                )


def test_a_one_chunk_segment_is_verified_once_and_decoded_without_a_python_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Most segments fit in one chunk (one per reducer and run): Arrow reads those from the
    verified bytes natively. Reading them through ``VerifiedSegment.read`` cost a Python call per
    message part, most of what checksums cost a reader; longer segments still go through it."""
    path = str(tmp_path / "m.arrows")
    outputs = write(path, rows=200_000, memory=4 << 20)
    want = read_all(path, outputs)
    calls: list[int] = []
    python_read = VerifiedSegment.read

    def counted(self: VerifiedSegment, size: int = -1) -> Any:
        calls.append(size)
        return python_read(self, size)

    monkeypatch.setattr(VerifiedSegment, "read", counted)
    for o, expected in zip(outputs, want, strict=True):
        for segment in o.segments:
            before = len(calls)
            got = pa.Table.from_batches(list(read_segments(path, [segment])), schema=SCHEMA)
            assert got.num_rows > 0
            assert (len(calls) > before) == (segment[1] > CHUNK_BYTES)
        assert pa.Table.from_batches(list(read_segments(path, o.segments)), schema=SCHEMA).equals(expected)
    assert any(s[1] > CHUNK_BYTES for o in outputs for s in o.segments)
    small = next(s for o in outputs for s in o.segments if s[1] <= CHUNK_BYTES)
    flip(path, small[0] + small[1] // 2)
    with pytest.raises(CorruptDataError, match="checksum mismatch"):
        next(iter(read_segments(path, [small])))


def test_truncated_empty_and_foreign_files_and_lying_indexes_are_corrupt(tmp_path: Path) -> None:
    path = str(tmp_path / "m.arrows")
    outputs = write(path)
    segments = [s for o in outputs for s in o.segments]
    offset, length, crcs = segments[-1]
    with open(path, "r+b") as f:
        f.truncate(offset + length // 2)
    with pytest.raises(CorruptDataError, match="truncated"):
        list(read_segments(path, [segments[-1]]))
    Path(path).write_bytes(b"")
    with pytest.raises(CorruptDataError, match="truncated"):
        list(read_segments(path, [segments[0]]))
    Path(path).write_bytes(os.urandom(segments[0][0] + segments[0][1] + 100))  # a foreign file
    with pytest.raises(CorruptDataError, match="not a map output"):
        list(read_segments(path, [segments[0]]))
    write(path + "2")
    with pytest.raises(CorruptDataError, match="checksums, expected"):  # an index that lies
        list(read_segments(path + "2", [(offset, 3 * CHUNK_BYTES, crcs[:1])]))
    with pytest.raises(CorruptDataError, match="inside the file's header"):
        list(read_segments(path + "2", [(0, length, crcs)]))


def test_without_checksums_segments_are_unchecked_but_still_bounded(tmp_path: Path) -> None:
    path = str(tmp_path / "m.arrows")
    outputs = write(path, checksum=False)
    assert all(crcs == [] for o in outputs for _, _, crcs in o.segments)
    assert sum(t.num_rows for t in read_all(path, outputs)) == 60_000
    offset, length, _ = outputs[0].segments[0]
    with open(path, "r+b") as f:  # garbage over a message header is still refused
        f.seek(offset)
        f.write(b"A" * 16)
    with pytest.raises(CorruptDataError, match="corrupt"):
        list(read_segments(path, [(offset, length)]))


# -- the owner's agent ---------------------------------------------------------------------------
class Blocks:
    """Stands in for Spark's block folders: which task attempts' status blocks were removed."""

    def __init__(self, present: bool = True) -> None:
        self.present = present
        self.removed: list[tuple[tuple[str, ...], int]] = []

    def __call__(self, local_dirs: Sequence[str], task_attempt_id: int) -> list[str]:
        self.removed.append((tuple(local_dirs), task_attempt_id))
        return [f"shuffle_0_{task_attempt_id}_0.data"] if self.present else []


@pytest.fixture
def told() -> dict[str, list[str]]:
    return {"jvm": [], "events": []}


@pytest.fixture
def service(tmp_path: Path, told: dict[str, list[str]]) -> Iterator[MapOutputService]:
    svc = MapOutputService(
        "app-c",
        "5",
        SECRET,
        str(tmp_path / "root"),
        jvm_pid=7373,
        on_outputs_lost=told["jvm"].append,
        spark_local_dirs=[str(tmp_path / "local")],
        on_corrupt=told["events"].append,
    )
    yield svc
    svc.close()


def output_of(svc: MapOutputService, shuffle: int, name: str = NAME, reducers: int = 2) -> tuple[str, Any]:
    path = str(Path(svc.dir) / f"s{shuffle}" / name)
    return path, write(path, reducers=reducers, rows=20_000)


def test_a_damaged_output_is_removed_and_its_map_partition_recomputed(
    service: MapOutputService, told: dict[str, list[str]], tmp_path: Path
) -> None:
    blocks = Blocks()
    service.corrupt._remove_blocks = blocks
    path, _ = output_of(service, 1)
    assert name_parts(path) == (3, 41)
    with MapOutputClient(service.control_address, SECRET, "test") as client:
        assert client.report_corrupt(1, path, "checksum mismatch in chunk 0") == Outcome.RECOMPUTE
        assert not os.path.exists(path)  # nobody decodes it again
        assert blocks.removed == [((str(tmp_path / "local"),), 41)]
        assert client.report_corrupt(1, path, "again") == Outcome.RECOMPUTE  # once per file
        assert len(blocks.removed) == 1
        assert client.report_lost(1, [path]) is False  # removed on purpose, not lost
        assert client.corrupt_outputs(1) == [(3, path, "checksum mismatch in chunk 0")]
        assert client.corrupt_outputs(2) == []
        assert client.metrics()["shuffle_outputs_corrupt"] == 1
    assert told["jvm"] == []  # the executor stays
    (event,) = told["events"]
    assert "shuffle 1, map partition 3, executor 5" in event and path in event and "recomputes" in event


def test_without_status_blocks_to_drop_the_executor_is_replaced(
    service: MapOutputService, told: dict[str, list[str]]
) -> None:
    service.corrupt._remove_blocks = Blocks(present=False)
    path, _ = output_of(service, 2)
    assert service.report_corrupt(2, path, "does not decode") == Outcome.REPLACE
    assert told["jvm"] == ["outputs-corrupt"] and not os.path.exists(path)
    other, _ = output_of(service, 2, "not-a-map-task-name.arrows")  # no attempt id to go by
    assert service.report_corrupt(2, other, "checksum mismatch") == Outcome.REPLACE


def test_a_released_shuffle_cannot_be_recomputed_and_paths_outside_are_refused(
    service: MapOutputService, told: dict[str, list[str]], tmp_path: Path
) -> None:
    path, _ = output_of(service, 3)
    kept = Path(path).read_bytes()
    service.release_shuffle(3)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Path(path).write_bytes(kept)
    assert service.report_corrupt(3, path, "late reader") == Outcome.GONE
    assert told["jvm"] == []
    outside = tmp_path / "elsewhere.arrows"
    outside.write_bytes(b"not ours")
    refused = pytest.raises(ShuffleError, match=r"refused 'report_corrupt'.* is not inside")
    with MapOutputClient(service.control_address, SECRET, "test") as client, refused:
        client.report_corrupt(3, str(outside), "x")
    assert outside.exists()


def plan_for(
    service: MapOutputService, shuffle: int, reducers: int, host_local: bool, schema: pa.Schema = SCHEMA
) -> ShufflePlan:
    return ShufflePlan(
        "app-c",
        shuffle,
        service.root,
        SECRET,
        ("k",),
        reducers,
        schema.serialize().to_pybytes(),
        tuple(range(reducers)),
        read_host_local=host_local,
        lost_wait_s=0.2,
    )


def status_of(service: MapOutputService, path: str, outputs: Any, reducer: int) -> dict[str, Any]:
    host, data_port = service.data_address
    return {
        "map": 3,
        "attempt": "2.41.0",
        "executor": "5",
        "host": host,
        "data_port": data_port,
        "control_port": service.control_address[1],
        "path": path,
        "segments": json.dumps(outputs[reducer].segments),
        "bytes": outputs[reducer].bytes,
    }


def newer_format(path: str) -> None:
    """The file's header says format 3, its checksum made right: a file this version cannot read."""
    content = bytearray(Path(path).read_bytes())
    header = PREFIX_BYTES + struct.unpack_from("<I", content, 12)[0]
    struct.pack_into("<HI", content, 8, 3, 0)
    content[16:20] = b"\x00" * 4
    struct.pack_into("<I", content, 16, digest(bytes(content[:header])))
    Path(path).write_bytes(bytes(content))


@pytest.mark.parametrize("damage", ["segment", "newer format", "another schema"])
@pytest.mark.parametrize("host_local", [True, False], ids=["host-local", "streamed"])
def test_a_reduce_task_that_meets_damage_fails_to_be_retried_and_its_owner_acts(
    service: MapOutputService, told: dict[str, list[str]], host_local: bool, damage: str
) -> None:
    """Read host-locally, the reduce task tells the owner; streamed, the owner found it itself.
    Either way the task fails with ``MapOutputLostError`` naming the map partition, its executor
    and the file, and the owner removed the file and dropped the status blocks. A file whose
    header the reader cannot take (a format it does not know, a schema not the shuffle's) goes
    the same way as a segment that fails its checksum."""
    blocks = Blocks()
    service.corrupt._remove_blocks = blocks
    path, outputs = output_of(service, 4)
    offset, length, _ = outputs[0].segments[0]
    schema = SCHEMA
    if damage == "segment":
        flip(path, offset + length // 2)
    elif damage == "newer format":
        newer_format(path)
    else:
        schema = pa.schema([("k", pa.int64()), ("s", pa.large_string()), ("x", pa.float64())])
    reader = AgentInfo("6", "127.0.0.1", 0, 0, "")  # another executor on the same host
    statuses = {0: [status_of(service, path, outputs, 0)]}
    with pytest.raises(MapOutputLostError) as failed:
        list(read_partitions(plan_for(service, 4, 2, host_local, schema), statuses, reader, ReadStats()))
    message = str(failed.value)
    if host_local:
        assert f"map partition 3 on executor 5 ({path}) is damaged" in message
        assert "recomputes map partition 3" in message
    else:
        assert "map outputs [3] from executors ['5']" in message
    assert not os.path.exists(path) and [t for _, t in blocks.removed] == [41]
    assert told["jvm"] == [] and len(told["events"]) == 1
    assert service.metrics()["shuffle_streams_open"] == 0


def test_the_driver_tells_a_rewritten_damaged_partition_by_its_stage() -> None:
    """``shuffle_metrics`` marks a write report ``corrupt`` when a later stage wrote the partition
    whose file an agent found damaged: the stage comes from the file's name. Pipelined attempts
    name no stage."""
    assert written_by(f"/x/s1/{NAME}") == "2.41.0" and written_by("/x/s1/other.arrows") is None
    assert _stage("9.20.0") == 9 and _stage("pipelined.0") == -1 and _stage("pipelined") == -1


def test_readers_racing_on_one_damaged_file_get_one_answer_and_no_replacement(
    service: MapOutputService, told: dict[str, list[str]]
) -> None:
    """While one reader's finding is handled (the file removed, the blocks being removed), another
    reader that finds the file gone must not report it lost, and a second finding of the same
    file must get the first's answer, not find the blocks gone and replace the executor."""
    entered, release = threading.Event(), threading.Event()
    calls: list[int] = []

    def slow_blocks(local_dirs: Sequence[str], task_attempt_id: int) -> list[str]:
        calls.append(task_attempt_id)
        if len(calls) == 1:
            entered.set()
            release.wait(10)
            return ["shuffle_0_41_0.index"]
        return []  # already removed

    service.corrupt._remove_blocks = slow_blocks
    path, _ = output_of(service, 6)
    answers: list[Outcome] = []
    first = threading.Thread(target=lambda: answers.append(service.report_corrupt(6, path, "checksum")))
    first.start()
    assert entered.wait(10)
    assert not os.path.exists(path)
    assert service.report_lost(6, [path]) is False  # gone on purpose, being handled
    second = threading.Thread(target=lambda: answers.append(service.report_corrupt(6, path, "again")))
    second.start()
    release.set()
    first.join(10)
    second.join(10)
    assert answers == [Outcome.RECOMPUTE, Outcome.RECOMPUTE] and calls == [41]
    assert told["jvm"] == []
