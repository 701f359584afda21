"""Map-output files of format 2 (``map_output_format``: the schema once, in a header) without Spark.

Round trips of many runs and segments, reducers without rows, the types Spark hands a Python
worker (nested, decimal, timestamps, maps) and dictionaries; the bytes a wide file takes against
the Arrow data it holds, and against format 1 (a schema message per segment); files of format 1
written by the previous version still read; a header that lies (damaged, truncated, an unknown
version or flag, a schema not the shuffle's) is a ``CorruptDataError``, never a crash or a row.
"""

from __future__ import annotations

import datetime as dt
import decimal
import itertools
import json
import os
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from arrow_shuffle import CorruptDataError, ShuffleError
from arrow_shuffle.checksum import CHUNK_BYTES, digest, region_checksums
from spark_plugin.shuffle.map_output import MapOutputWriter, ReducerOutput, read_segments, route
from spark_plugin.shuffle.map_output_format import MAGIC, PREFIX_BYTES, VERSION, encode_header, read_header

DATA = Path(__file__).parent / "data"
MIXED = pa.schema(
    [
        ("k", pa.int64()),
        ("s", pa.string()),
        ("x", pa.float64()),
        ("d", pa.decimal128(20, 4)),
        ("t", pa.timestamp("us", tz="UTC")),
        ("day", pa.date32()),
        ("ok", pa.bool_()),
        ("raw", pa.binary()),
        ("st", pa.struct([("a", pa.int32()), ("b", pa.list_(pa.string()))])),
        ("m", pa.map_(pa.string(), pa.float64())),
    ]
)


def mixed(n: int, start: int = 0) -> pa.RecordBatch:
    """``n`` rows of ``MIXED``, nulls in every column, the same for the same ``start``."""
    i = range(start, start + n)
    return pa.record_batch(
        [
            pa.array([None if j % 31 == 0 else j * 7919 % 1009 for j in i], pa.int64()),
            pa.array([None if j % 7 == 0 else f"é{j % 13}🙂" for j in i]),
            pa.array([j / 3 for j in i]),
            pa.array([decimal.Decimal(j).scaleb(-4) for j in i], pa.decimal128(20, 4)),
            pa.array(
                [dt.datetime(2024, 2, 29, tzinfo=dt.UTC) + dt.timedelta(seconds=j) for j in i], MIXED[4].type
            ),
            pa.array([dt.date(1969, 12, 31) + dt.timedelta(days=j) for j in i]),
            pa.array([None if j % 5 == 0 else j % 2 == 0 for j in i]),
            pa.array([bytes([j % 256]) * (j % 4) for j in i]),
            pa.array([None if j % 11 == 0 else {"a": j, "b": [str(j)] * (j % 3)} for j in i], MIXED[8].type),
            pa.array([[(f"e{j % 3}", j / 2)] * (j % 2) for j in i], MIXED[9].type),
        ],
        schema=MIXED,
    )


def write(
    path: str,
    schema: pa.Schema,
    batches: Sequence[pa.RecordBatch],
    reducers: int,
    memory: int,
    checksum: bool = True,
) -> tuple[MapOutputWriter, list[ReducerOutput]]:
    writer = MapOutputWriter(path, schema, ["k"], reducers, memory, checksum=checksum)
    for b in batches:
        writer.write(b)
    return writer, writer.finish()


def table_of(path: str, outputs: Sequence[ReducerOutput], schema: pa.Schema, **kw: Any) -> list[pa.Table]:
    return [
        pa.Table.from_batches(list(read_segments(path, o.segments, **kw)), schema=schema) for o in outputs
    ]


def expected(batches: Sequence[pa.RecordBatch], reducers: int) -> list[pa.Table]:
    """Each reducer's rows in the order they were written: what its segments must hold."""
    whole = pa.Table.from_batches(batches).combine_chunks()
    ids = np.asarray(route(whole.to_batches()[0], ["k"], reducers))
    return [whole.take(pa.array(np.flatnonzero(ids == r))) for r in range(reducers)]


@pytest.mark.parametrize("checksum", [True, False], ids=["checksums", "unchecked"])
def test_many_runs_and_segments_round_trip_with_the_schema_once(tmp_path: Path, checksum: bool) -> None:
    """Every type Spark hands a worker, 9 reducers (some without rows), several runs: each reducer
    reads back exactly its rows in order; the file holds one schema message, at its start."""
    path = str(tmp_path / "m.arrows")
    batches = [mixed(700, start) for start in range(0, 7000, 700)]
    writer, outputs = write(path, MIXED, batches, 9, 128 << 10, checksum)
    assert writer.spill_bytes > 0 and max(len(o.segments) for o in outputs) >= 3  # several runs
    for got, want in zip(table_of(path, outputs, MIXED), expected(batches, 9), strict=True):
        assert got.equals(want)
    content = Path(path).read_bytes()
    assert content.startswith(MAGIC) and os.path.getsize(path) == writer.file_bytes
    schema_message = encode_header(MIXED, False)[PREFIX_BYTES:]
    assert content.count(schema_message) == 1 and content.index(schema_message) == PREFIX_BYTES
    with open(path, "rb") as f:
        header = read_header(f.fileno(), path, MIXED)
    assert (header.version, header.streams, header.schema) == (VERSION, False, MIXED)
    assert min(offset for o in outputs for offset, _, _ in o.segments) == header.length == writer.header_bytes
    ends = sorted((offset, offset + length) for o in outputs for offset, length, _ in o.segments)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ends))  # nothing between segments
    assert ends[-1][1] == len(content) and all(offset % 8 == 0 for offset, _ in ends)


def test_a_segment_is_the_batch_messages_arrows_stream_writer_writes(tmp_path: Path) -> None:
    """The file's one IPC writer writes every segment, its schema message being the header's
    rest: a segment must be byte for byte what Arrow's stream writer writes after its schema
    message, so any IPC reader given the header's schema reads it as a stream."""
    path = str(tmp_path / "m.arrows")
    batches = [mixed(700, start) for start in range(0, 7000, 700)]
    _, outputs = write(path, MIXED, batches, 5, 128 << 10)
    content = Path(path).read_bytes()
    schema_message = encode_header(MIXED, False)[PREFIX_BYTES:]
    for output in outputs:
        for offset, length, _ in output.segments:
            segment = content[offset : offset + length]
            decoded = list(pa.ipc.open_stream(schema_message + segment))
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, MIXED) as writer:
                for batch in decoded:
                    writer.write_batch(batch)
            stream = sink.getvalue().to_pybytes()
            assert stream == schema_message + segment + b"\xff\xff\xff\xff\x00\x00\x00\x00"


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="descriptors are listed through /proc")
def test_no_descriptor_of_a_map_output_is_inherited_by_programs_a_task_starts(tmp_path: Path) -> None:
    """Arrow opens the file by name, with a descriptor Python did not make: it is made
    non-inheritable as Python's own are, so a program a task starts holds no shuffle file."""
    path = str(tmp_path / "m.arrows")
    writer = MapOutputWriter(path, MIXED, ["k"], 3, 1 << 20)
    try:
        writer.write(mixed(100))
        ours = [
            int(fd)
            for fd in os.listdir("/proc/self/fd")
            if os.path.realpath(f"/proc/self/fd/{fd}") == os.path.realpath(path)
        ]
        assert len(ours) == 2  # Arrow's, and the one the checksums read back through
        assert not any(os.get_inheritable(fd) for fd in ours)
    finally:
        writer.finish()


def test_a_map_output_that_cannot_be_opened_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Created, then Arrow's open fails (out of descriptors, say): a ``ShuffleError`` naming the
    key to check, and no empty file left under the shuffle dir."""

    def no_descriptors(*args: Any, **kwargs: Any) -> Any:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(pa, "OSFile", no_descriptors)
    path = tmp_path / "m.arrows"
    with pytest.raises(ShuffleError, match=r"Too many open files.*spark\.arrowbeat\.shuffle\.dir"):
        MapOutputWriter(str(path), MIXED, ["k"], 3, 1 << 20)
    assert not path.exists()


def test_reducers_without_rows_and_empty_segments_read_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "m.arrows")
    batches = [mixed(3)]
    writer, outputs = write(path, MIXED, batches, 50, 1 << 30)
    empty = [o for o in outputs if o.rows == 0]
    assert len(empty) >= 47 and all(o.segments == [] and o.bytes == 0 for o in empty)
    assert list(read_segments(path, [])) == []
    assert list(read_segments(path, [(writer.header_bytes, 0, [])])) == []
    none_at_all = str(tmp_path / "none.arrows")
    nothing, outputs = write(none_at_all, MIXED, [], 4, 1 << 30)
    assert os.path.getsize(none_at_all) == nothing.header_bytes and all(o.rows == 0 for o in outputs)
    assert list(read_segments(none_at_all, [], schema=MIXED)) == []  # a whole header, verified


def test_dictionary_columns_keep_a_stream_per_segment(tmp_path: Path) -> None:
    """A schema with dictionary fields (nested too) writes whole IPC streams, each with the
    dictionaries its batches need (``FLAG_STREAMS``): a reducer's rows decode on their own."""
    schema = pa.schema(
        [
            ("k", pa.int64()),
            ("c", pa.dictionary(pa.int8(), pa.string())),
            ("l", pa.list_(pa.dictionary(pa.int16(), pa.string()))),
        ]
    )
    n = 5000
    batch = pa.record_batch(
        [
            pa.array(np.arange(n) % 97),
            pa.array([f"v{i % 5}" for i in range(n)]).dictionary_encode().cast(schema[1].type),
            pa.array([[f"w{i % 3}"] for i in range(n)], schema[2].type),
        ],
        schema=schema,
    )
    path = str(tmp_path / "m.arrows")
    _, outputs = write(path, schema, [batch.slice(0, 2500), batch.slice(2500)], 4, 64 << 10)
    with open(path, "rb") as f:
        assert read_header(f.fileno(), path).streams
    got = table_of(path, outputs, schema)
    for table, want in zip(got, expected([batch], 4), strict=True):
        assert table.equals(want)


def test_two_hundred_columns_for_two_hundred_reducers_is_the_arrow_data_and_a_header(tmp_path: Path) -> None:
    """The issue's wide case: 200 int64/double columns split over 200 reducers. Format 1 repeated
    a 9.3 KB schema in every segment; format 2 is the batches' IPC messages and one header.

    - Few rows per reducer (10): the file is its batches' IPC messages to within 0.2 % (format
      1: 36 % more); what stays above the bodies is each batch message's metadata (16 bytes per
      column and per buffer, 9.6 KB here), which Arrow's format has per batch.
    - A segment of 200 rows (about 320 KB, a 64 MB run): within 5 % of the bodies alone."""
    schema = pa.schema(
        [("k", pa.int64())] + [(f"c{i}", pa.float64() if i % 2 else pa.int64()) for i in range(199)]
    )
    rng = np.random.default_rng(39)

    def wide(rows: int) -> list[pa.RecordBatch]:
        columns = [pa.array(rng.integers(0, 1 << 40, rows))]
        columns += [pa.array(rng.random(rows) if i % 2 else rng.integers(0, 99, rows)) for i in range(199)]
        batches: list[pa.RecordBatch] = pa.table(columns, schema=schema).to_batches(max_chunksize=10_000)
        return batches

    for rows, bound_body in ((2_000, None), (40_000, 1.05)):
        path = str(tmp_path / f"m{rows}.arrows")
        batches = wide(rows)
        writer, outputs = write(path, schema, batches, 200, 1 << 40)  # one run
        size = os.path.getsize(path)
        bodies, messages, read = 0, 0, 0
        for o in outputs:
            for b in read_segments(path, o.segments, schema=schema):
                serialized = b.serialize()
                bodies += pa.ipc.read_message(serialized).body.size
                messages += serialized.size
                read += b.num_rows
        assert read == rows
        assert size == messages + writer.header_bytes  # the batches' messages and one header
        assert writer.header_bytes < 0.002 * size
        if bound_body is not None:
            assert size <= bound_body * bodies, (rows, size, bodies)
        tables = expected(batches, 200)
        old, _ = legacy_file(str(tmp_path / f"old{rows}.arrows"), schema, tables)
        old_messages = sum(b.serialize().size for t in tables for b in t.to_batches(max_chunksize=16384))
        streams = sum(1 for t in tables if t.num_rows)
        # Format 1: a schema message and an end-of-stream marker in every segment.
        assert os.path.getsize(old) == old_messages + streams * (writer.header_bytes - PREFIX_BYTES + 8)
        if rows == 2_000:
            assert os.path.getsize(old) > 1.35 * size


def legacy_file(path: str, schema: pa.Schema, tables: Sequence[pa.Table]) -> tuple[str, list[list[Any]]]:
    """A file of format 1 as the previous ``MapOutputWriter`` wrote it: one run, each reducer's
    rows a whole IPC stream (schema, batches, end) with its checksums."""
    positions: list[tuple[int, int] | None] = []
    with pa.OSFile(path, "w") as file:
        for table in tables:
            if table.num_rows == 0:
                positions.append(None)
                continue
            offset = file.tell()
            with pa.ipc.new_stream(file, schema) as stream:
                for batch in table.to_batches(max_chunksize=16384):
                    stream.write_batch(batch)
            positions.append((offset, file.tell() - offset))
    segments: list[list[Any]] = []
    fd = os.open(path, os.O_RDONLY)
    try:
        for position in positions:
            if position is None:
                segments.append([])
            else:
                crcs = region_checksums(fd, *position, bytearray(CHUNK_BYTES), path)
                segments.append([[*position, crcs]])
    finally:
        os.close(fd)
    return path, segments


def test_files_of_format_one_still_read(tmp_path: Path) -> None:
    """A file the previous version wrote (``data/format1.arrows``: its ``MapOutputWriter``, 3
    reducers, 2 runs, every ``MIXED`` type) reads back exactly, with and without its checksums;
    so does one written as it wrote them, of 200 reducers."""
    index = json.loads((DATA / "format1.json").read_text())
    batches = [mixed(200, start) for start in range(0, 1200, 200)]
    want = expected(batches, 3)
    path = str(DATA / "format1.arrows")
    assert Path(path).read_bytes()[:4] == b"\xff\xff\xff\xff"
    assert sum(len(s) for s in index) > 3  # several runs
    for segments, table in zip(index, want, strict=True):
        assert pa.Table.from_batches(list(read_segments(path, segments, schema=MIXED)), schema=MIXED).equals(
            table
        )
        unchecked = [s[:2] for s in segments]
        assert pa.Table.from_batches(list(read_segments(path, unchecked)), schema=MIXED).equals(table)
    wide_want = expected(batches, 200)
    legacy, wide_index = legacy_file(str(tmp_path / "old.arrows"), MIXED, wide_want)
    for segments, table in zip(wide_index, wide_want, strict=True):
        assert pa.Table.from_batches(list(read_segments(legacy, segments)), schema=MIXED).equals(table)


def sealed(header: bytearray) -> bytes:
    """``header`` with its checksum made right again: a lie the checksum cannot catch."""
    header[16:20] = b"\x00" * 4
    header[16:20] = struct.pack("<I", digest(bytes(header)))
    return bytes(header)


def rewrite_header(path: str, change: Any) -> None:
    content = bytearray(Path(path).read_bytes())
    length = PREFIX_BYTES + struct.unpack_from("<I", content, 12)[0]
    header = bytearray(content[:length])
    change(header)
    Path(path).write_bytes(bytes(header) + bytes(content[length:]))


def _version(header: bytearray, version: int) -> None:
    struct.pack_into("<H", header, 8, version)
    header[:] = sealed(header)


def _flags(header: bytearray) -> None:
    struct.pack_into("<H", header, 10, 0x4)
    header[:] = sealed(header)


def _renamed(header: bytearray) -> None:
    """The schema of a shuffle whose column ``s`` is ``q``: another file's header, sealed."""
    at = header.index(b"\x01\x00\x00\x00s\x00")  # flatbuffers: the name "s", length 1
    header[at + 4] = ord("q")
    header[:] = sealed(header)


def _garbage_schema(header: bytearray) -> None:
    header[PREFIX_BYTES + 8 : PREFIX_BYTES + 40] = b"\xa5" * 32
    header[:] = sealed(header)


def _long_schema(header: bytearray) -> None:
    struct.pack_into("<I", header, 12, struct.unpack_from("<I", header, 12)[0] + (1 << 20))
    header[:] = sealed(header)


@pytest.mark.parametrize(
    "lie, message",
    [
        (lambda h: _version(h, 3), "format 3 .*reads formats 1 and 2"),
        (lambda h: _version(h, 1), "format 1 "),
        (_flags, r"flags 0x4"),
        (_renamed, r"not the shuffle's \(k: int64, s: string"),
        (_garbage_schema, "schema in its header does not decode"),
        (_long_schema, "ends inside its header"),
        (lambda h: h.__setitem__(slice(20, 24), b"\x01\x00\x00\x00"), "header is damaged"),
        (lambda h: h.__setitem__(12, h[12] ^ 0x08), "checksum mismatch in its header"),
        (
            lambda h: h.__setitem__(PREFIX_BYTES + 30, h[PREFIX_BYTES + 30] ^ 0x10),
            "checksum mismatch in its header",
        ),
        (lambda h: h.__setitem__(3, h[3] ^ 0x20), "not a map output"),
    ],
    ids=[
        "newer",
        "old-version-with-header",
        "flag",
        "schema",
        "garbage",
        "length",
        "reserved",
        "length-bit",
        "schema-bit",
        "magic",
    ],
)
def test_a_header_that_lies_is_corrupt_data_never_a_row(tmp_path: Path, lie: Any, message: str) -> None:
    """Every segment of a file whose header lies is a ``CorruptDataError`` (the recompute path of
    a checksum mismatch) before any batch is decoded, with or without segment checksums."""
    for checksum in (True, False):
        path = str(tmp_path / f"m{checksum}.arrows")
        _, outputs = write(path, MIXED, [mixed(2000)], 3, 1 << 30, checksum)
        rewrite_header(path, lie)
        for o in outputs:
            with pytest.raises(CorruptDataError, match=message):
                next(iter(read_segments(path, o.segments, schema=MIXED)))


def test_a_truncated_header_is_corrupt(tmp_path: Path) -> None:
    path = str(tmp_path / "m.arrows")
    writer, outputs = write(path, MIXED, [mixed(100)], 2, 1 << 30)
    content = Path(path).read_bytes()
    for cut in (3, PREFIX_BYTES - 1, writer.header_bytes - 1):
        Path(path).write_bytes(content[:cut])
        with pytest.raises(CorruptDataError, match="truncated"):
            list(read_segments(path, outputs[0].segments))


def test_a_format_one_file_of_another_schema_is_corrupt(tmp_path: Path) -> None:
    """A format-1 file names no schema but its segments' streams': a reader that expects the
    shuffle's schema refuses one of another (a foreign file, a plan from another shuffle)."""
    index = json.loads((DATA / "format1.json").read_text())
    other = pa.schema([field for field in MIXED if field.name != "raw"])
    for segments in (index[0], [s[:2] for s in index[0]]):  # with and without its checksums
        with pytest.raises(CorruptDataError, match="not the shuffle's"):
            list(read_segments(str(DATA / "format1.arrows"), segments, schema=other))


def test_an_unchecked_segment_whose_offsets_lie_is_corrupt_not_a_crash(tmp_path: Path) -> None:
    """Without checksums (``spark.arrowbeat.shuffle.checksum=false``) a string column's offset
    pointing far past its data decodes; read, it would take the process down. Every batch of an
    unchecked segment is validated whole before it is handed out."""
    schema = pa.schema([("k", pa.int64()), ("s", pa.string())])
    values = [f"v{i:06d}" for i in range(64)]  # 7 bytes each: offsets 0, 7, 14, ... as int32
    batch = pa.record_batch([pa.array(range(64), pa.int64()), pa.array(values)], schema=schema)
    path = str(tmp_path / "unchecked.arrows")
    _, outputs = write(path, schema, [batch], 1, 1 << 20, checksum=False)
    [(offset, length, crcs)] = outputs[0].segments
    assert crcs == []
    content = bytearray(Path(path).read_bytes())
    offsets = np.arange(0, 7 * 65, 7, dtype="<i4").tobytes()
    at = content.find(offsets, offset, offset + length)
    assert at > 0, "the offsets buffer is where the segment holds it"
    struct.pack_into("<i", content, at + 4 * 32, 0x7FFF_FFF0)  # the 33rd value's offset, far out
    Path(path).write_bytes(bytes(content))
    with pytest.raises(CorruptDataError, match=f"segment at {offset} is corrupt"):
        list(read_segments(path, [(offset, length)], schema=schema))
