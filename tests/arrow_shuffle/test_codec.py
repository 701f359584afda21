"""The payload codec's two shortcuts: one IPC writer kept open per schema (``PayloadEncoder``) and
payloads of the expected schema read message by message (``codec._read``). Each must give exactly
what the long way gives, and fall back to it wherever the shortcut does not hold."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from arrow_shuffle import NetworkBufferPool
from arrow_shuffle.buffer_pool import Buffer
from arrow_shuffle.codec import BufferBuilder, PayloadEncoder, decode, encode_parts
from arrow_shuffle.errors import CorruptFrameError, SchemaMismatchError

from .test_zero_copy import RICH, rich_batch

PLAIN = pa.schema([field for field in RICH if not pa.types.is_dictionary(field.type)])


def plain_batch(start: int, rows: int) -> pa.RecordBatch:
    batch = rich_batch(start, rows)
    return pa.record_batch([batch.column(f.name) for f in PLAIN], schema=PLAIN)


@pytest.fixture()
def leases() -> list[Buffer]:
    pool = NetworkBufferPool(2, 1 << 20)
    segments = pool.reserve(2, "test leases")

    class Keep:
        def recycle_segment(self, segment: object) -> None:
            pass

    return [Buffer(segment, Keep()) for segment in segments]


def joined(payload: Buffer | None) -> bytes:
    assert payload is not None
    parts = payload.parts  # type: ignore[attr-defined]
    data = b"".join(p if isinstance(p, bytes) else p.to_pybytes() for p in parts)
    assert len(data) == payload.size
    return data


@pytest.mark.parametrize(
    "batches",
    [
        [plain_batch(0, 500), plain_batch(500, 500), plain_batch(1000, 3)],
        [plain_batch(0, 1000).slice(7, 301), plain_batch(0, 1000).slice(333, 1)],  # odd offsets
        [plain_batch(0, 10).slice(0, 0), plain_batch(10, 10)],  # an empty batch first
    ],
    ids=["whole", "sliced", "empty-first"],
)
def test_a_kept_writer_gives_the_bytes_of_a_fresh_stream(
    batches: list[pa.RecordBatch], leases: list[Buffer]
) -> None:
    encoder = PayloadEncoder(PLAIN)
    for batch in batches:
        kept = joined(encoder.encode(leases[0], batch))
        fresh = joined(encode_parts(leases[1], batch, PLAIN))
        assert kept == fresh
        assert pa.Table.from_batches(decode(pa.py_buffer(kept), PLAIN, "test")).equals(
            pa.Table.from_batches([batch])
        )


def test_dictionary_payloads_each_carry_their_own_dictionary(leases: list[Buffer]) -> None:
    """A kept writer would send a dictionary once: each payload must decode on its own."""
    encoder = PayloadEncoder(RICH)
    first = pa.record_batch([rich_batch(0, 9).column(i) for i in range(len(RICH))], schema=RICH)
    labels = pa.array(["x", "y", "x"] * 3).dictionary_encode()
    second = first.set_column(RICH.get_field_index("label"), RICH.field("label"), labels)
    for batch in (first, second):
        payload = joined(encoder.encode(leases[0], batch))
        got = pa.Table.from_batches(decode(pa.py_buffer(payload), RICH, "test"))
        assert got.to_pylist() == pa.Table.from_batches([batch]).to_pylist()


def test_a_failed_write_does_not_spoil_the_next_payload(leases: list[Buffer]) -> None:
    encoder = PayloadEncoder(PLAIN)
    encoder.encode(leases[0], plain_batch(0, 5))
    with pytest.raises((pa.ArrowInvalid, ValueError)):
        encoder.encode(leases[0], rich_batch(0, 5))  # another schema
    batch = plain_batch(5, 5)
    assert joined(encoder.encode(leases[0], batch)) == joined(encode_parts(leases[1], batch, PLAIN))


def test_a_payload_too_large_for_the_lease_is_refused(leases: list[Buffer]) -> None:
    big = pa.record_batch([pa.array(np.arange(200_000, dtype=np.int64))], names=["n"])  # 1.6 MB
    encoder = PayloadEncoder(big.schema)
    assert encoder.encode(leases[0], big.slice(0, 10)) is not None
    assert encoder.encode(leases[0], big) is None


def _coalesced(batches: list[pa.RecordBatch], lease: Buffer, schema: pa.Schema) -> bytes:
    builder = BufferBuilder(lease, schema)
    for batch in batches:
        builder.append(batch)
    done = builder.finish()
    return bytes(done.segment.view[: done.size])


def test_our_schema_is_read_message_by_message_without_a_stream_reader(
    leases: list[Buffer], monkeypatch: pytest.MonkeyPatch
) -> None:
    batches = [plain_batch(0, 40), plain_batch(40, 1), plain_batch(41, 0), plain_batch(41, 17)]
    payload = _coalesced(batches, leases[0], PLAIN)

    def no_stream_reader(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the payload was read as a stream")

    monkeypatch.setattr(pa.ipc, "open_stream", no_stream_reader)
    got = decode(pa.py_buffer(payload), PLAIN, "test")
    assert [b.num_rows for b in got] == [40, 1, 0, 17]
    assert pa.Table.from_batches(got).equals(pa.Table.from_batches(batches))


def test_other_schemas_and_damaged_payloads_take_the_checked_way(leases: list[Buffer]) -> None:
    batch = plain_batch(0, 30)
    # Equal fields, other metadata: not our schema message, still our schema (read as a stream).
    tagged = PLAIN.with_metadata({"from": "elsewhere"})
    payload = _coalesced([batch.replace_schema_metadata(tagged.metadata)], leases[0], tagged)
    assert pa.Table.from_batches(decode(pa.py_buffer(payload), PLAIN, "test")).equals(
        pa.Table.from_batches([batch])
    )
    other = pa.schema([("n", pa.int64())])
    with pytest.raises(SchemaMismatchError):
        decode(pa.py_buffer(payload), other, "test")
    ours = _coalesced([batch], leases[1], PLAIN)
    with pytest.raises(CorruptFrameError, match="Arrow IPC"):
        decode(pa.py_buffer(ours[: len(ours) - 100]), PLAIN, "test")  # cut inside the batch
    with pytest.raises(CorruptFrameError, match="Arrow IPC"):
        decode(pa.py_buffer(ours[:300] + b"\x07" * (len(ours) - 300)), PLAIN, "test")
