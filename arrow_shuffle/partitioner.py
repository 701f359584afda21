"""Routing rows to subpartitions: a deterministic, vectorised hash of key columns.

Python's ``hash()`` is salted per process, so it cannot route rows consistently across
executors. Here integers, booleans, temporals, floats and decimals are mixed with splitmix64 in
numpy; strings and binaries are dictionary-encoded and each distinct value hashed once with
BLAKE2b; structs, lists and maps combine the hashes of their children. The result depends only
on the values, never on the process, the batch or its encoding (dictionary or not).

Equal keys must land in one partition under Spark's ``groupBy`` equality, so the hash follows it:
-0.0 hashes as 0.0 and every NaN payload as one NaN (at any depth), a null of any type hashes to
one constant, and a map hashes by its entries in no particular order (Spark 4 groups
``map(1, 2, 3, 4)`` with ``map(3, 4, 1, 2)``). ``key_type_problem`` says which types these are.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from arrow_shuffle.errors import ShuffleConfigError

Partitioner = Callable[[pa.RecordBatch, int], np.ndarray]
"""Maps a batch and the subpartition count to one subpartition index per row."""

_NULL_HASH = np.uint64(0x9E3779B97F4A7C15)
# Salts keep a struct, a list and a map of the same leaves (and a decimal's words) apart.
_STRUCT_SALT = np.uint64(0x5F3759DF5F3759DF)
_LIST_SALT = np.uint64(0xC2B2AE3D27D4EB4F)
_MAP_SALT = np.uint64(0x165667B19E3779F9)
_WORD_SALT = np.uint64(0x27D4EB2F165667C5)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer of every value, in two arrays reused in place (a temporary per step
    took a fifth longer on 12 M values: each is fresh memory to fault in)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    shifted = x >> np.uint64(30)
    x ^= shifted
    x *= np.uint64(0xBF58476D1CE4E5B9)
    np.right_shift(x, np.uint64(27), out=shifted)
    x ^= shifted
    x *= np.uint64(0x94D049BB133111EB)
    np.right_shift(x, np.uint64(31), out=shifted)
    x ^= shifted
    return x


def _bytes_hash(value: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(value, digest_size=8).digest(), "little")


def _is_bytes_like(kind: pa.DataType) -> bool:
    return bool(
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
        or pa.types.is_fixed_size_binary(kind)
    )


def _is_flat_key(kind: pa.DataType) -> bool:
    """A leaf type rows can be grouped by (and hashed) as it is."""
    return (
        pa.types.is_null(kind)
        or pa.types.is_boolean(kind)
        or pa.types.is_integer(kind)
        or pa.types.is_floating(kind)
        or pa.types.is_decimal(kind)
        or pa.types.is_date(kind)
        or pa.types.is_time(kind)
        or pa.types.is_timestamp(kind)
        or pa.types.is_duration(kind)
        or _is_bytes_like(kind)
    )


def key_type_problem(field: pa.Field) -> str | None:
    """Why rows cannot be grouped (hash-partitioned) by a column like ``field``; None when they can.

    Spark groups by every orderable type, which in Arrow are the flat types above and structs,
    lists and (Spark 4) maps of them; it refuses variants, which its Arrow conversion turns into a
    struct of two binaries marked by field metadata, so the marker is looked for here. Arrow-only
    types Spark never produces (intervals, unions, string and list views, ...) are refused too:
    Arrow cannot even ``take`` a string view, which grouping does.
    """
    kind = field.type
    if field.metadata and field.metadata.get(b"variant") == b"true":
        return f"{field.name!r} is a variant, which Spark cannot group by either"
    if pa.types.is_dictionary(kind):
        return key_type_problem(pa.field(field.name, kind.value_type))
    if _is_flat_key(kind):
        return None
    if pa.types.is_struct(kind):
        for i in range(kind.num_fields):
            problem = key_type_problem(kind.field(i))
            if problem:
                return problem
        return None
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return key_type_problem(kind.value_field)
    if pa.types.is_map(kind):
        return key_type_problem(kind.key_field) or key_type_problem(kind.item_field)
    return f"{field.name!r} has type {kind}, which is not a type Spark can group by"


def hash_column(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """One stable uint64 per value of ``column``: equal under Spark's grouping, equal hash.

    Nulls hash to a fixed constant whatever the type. Raises ``ShuffleConfigError`` for a type
    ``key_type_problem`` refuses.
    """
    if isinstance(column, pa.ChunkedArray):  # one array: strings are hashed once per distinct value
        if column.num_chunks > 1 and _holds_float16_dictionary(column.type):
            return np.concatenate([hash_column(chunk) for chunk in column.chunks])
        column = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    kind = column.type
    if pa.types.is_dictionary(kind):  # each dictionary value once, then a gather
        per_value = hash_column(column.dictionary)  # null dictionary values hash as nulls there
        if not len(per_value):  # every index is null
            return np.full(len(column), _NULL_HASH, dtype=np.uint64)
        ids = pc.fill_null(column.indices, 0).to_numpy(zero_copy_only=False)
        gathered: np.ndarray = per_value[ids]
        if column.null_count == 0:
            return gathered
        return np.where(column.is_valid().to_numpy(False), gathered, _NULL_HASH)
    if pa.types.is_null(kind):
        return np.full(len(column), _NULL_HASH, dtype=np.uint64)
    valid = None if column.null_count == 0 else column.is_valid().to_numpy(False)
    hashed: np.ndarray
    if pa.types.is_floating(kind):
        floats = pc.fill_null(column.cast(pa.float64()), 0.0).to_numpy(zero_copy_only=False)
        floats = np.where(floats == 0.0, 0.0, floats)  # -0.0 == 0.0
        floats = np.where(np.isnan(floats), np.nan, floats)  # one NaN for every payload
        hashed = _splitmix64(floats.view(np.uint64))
    elif pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        if column.type != pa.int64():
            column = column.cast(pa.int64(), safe=False)  # uint64 keeps its bits
        hashed = _splitmix64(_filled_int64(column).view(np.uint64))
    elif (
        pa.types.is_date(kind)
        or pa.types.is_time(kind)
        or pa.types.is_timestamp(kind)  # any unit, with or without a zone: the instant's integer
        or pa.types.is_duration(kind)
    ):
        # date32/time32 have no cast to int64, but a view as int32 has one.
        ints = column.view(pa.int64()) if kind.bit_width == 64 else column.view(pa.int32()).cast(pa.int64())
        hashed = _splitmix64(_filled_int64(ints).view(np.uint64))
    elif pa.types.is_decimal(kind):
        hashed = _hash_decimal(column)
    elif _is_bytes_like(kind):
        hashed = _hash_bytes(column)
    elif pa.types.is_struct(kind):
        hashed = np.full(len(column), _STRUCT_SALT, dtype=np.uint64)
        for child in column.flatten():  # children carry the struct's nulls
            hashed = _splitmix64(hashed * np.uint64(31) + hash_column(child))
    elif pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        hashed = _hash_list(column)
    elif pa.types.is_map(kind):
        hashed = _hash_map(column)
    else:
        raise ShuffleConfigError(
            f"cannot hash-partition on a column of type {kind}; use an explicit partitioner"
        )
    if valid is None:
        return hashed
    result: np.ndarray = np.where(valid, hashed, _NULL_HASH)
    return result


def _holds_float16_dictionary(kind: pa.DataType) -> bool:
    """Chunks holding ``dictionary<halffloat>`` (at any depth) are hashed one by one, each against
    its own dictionaries: pyarrow 26's dictionary unification (``combine_chunks``) writes those
    values' bits back as numbers (-0.0, bits 0x8000, becomes 32768.0), so equal keys would hash apart."""
    if pa.types.is_dictionary(kind):
        return pa.types.is_float16(kind.value_type) or _holds_float16_dictionary(kind.value_type)
    return any(_holds_float16_dictionary(kind.field(i).type) for i in range(kind.num_fields))


def _filled_int64(column: pa.Array) -> np.ndarray:
    if column.null_count:
        column = pc.fill_null(column, 0)
    ints: np.ndarray = column.to_numpy(zero_copy_only=False)  # a view when int64 without nulls
    return ints


def _hash_decimal(column: pa.Array) -> np.ndarray:
    """The unscaled integer's little-endian words (one type per column: same scale, same words)."""
    n, width = len(column), column.type.byte_width
    buffer = column.buffers()[1]
    if width < 8:  # decimal32/64: the signed integer itself
        ints = np.frombuffer(buffer, dtype=f"<i{width}", count=n, offset=column.offset * width)
        words = ints.astype(np.int64).view(np.uint64).reshape(n, 1)
    else:
        words = np.frombuffer(buffer, dtype="<u8", count=n * width // 8, offset=column.offset * width)
        words = words.reshape(n, width // 8)
    hashed = _splitmix64(words[:, 0] + _WORD_SALT)
    for i in range(1, words.shape[1]):
        hashed = _splitmix64(hashed * np.uint64(31) + words[:, i])
    return hashed


def _hash_bytes(column: pa.Array) -> np.ndarray:
    encoded = pc.dictionary_encode(column)
    dictionary = encoded.dictionary.cast(pa.large_binary()).to_pylist()
    per_value = np.fromiter((_bytes_hash(v) for v in dictionary), dtype=np.uint64, count=len(dictionary))
    indices = pc.fill_null(encoded.indices, 0).to_numpy(zero_copy_only=False)
    hashed: np.ndarray = per_value[indices] if len(per_value) else np.zeros(len(column), dtype=np.uint64)
    return hashed


def _list_offsets(column: pa.Array) -> tuple[np.ndarray, pa.Array]:
    """``(offsets, values)``: list ``i`` holds ``values[offsets[i]:offsets[i + 1]]``."""
    if pa.types.is_fixed_size_list(column.type):
        size = column.type.list_size
        offsets = (np.arange(len(column) + 1, dtype=np.int64) + column.offset) * size
    else:
        offsets = column.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
    return offsets, column.values


def _segment_sums(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per segment ``[offsets[i], offsets[i + 1])``, the wrapping uint64 sum of ``values``."""
    running = np.concatenate([np.zeros(1, dtype=np.uint64), np.cumsum(values, dtype=np.uint64)])
    result: np.ndarray = running[offsets[1:]] - running[offsets[:-1]]
    return result


def _covered(offsets: np.ndarray, values: pa.Array) -> tuple[np.ndarray, pa.Array]:
    """Only the child values some slot covers (a slice may cover few of them), offsets rebased."""
    first, last = int(offsets[0]), int(offsets[-1])
    return offsets - first, values.slice(first, last - first)


def _hash_list(column: pa.Array) -> np.ndarray:
    """Order matters: each element is mixed with its position, then the list's sum with its length."""
    offsets, values = _covered(*_list_offsets(column))
    lengths = np.diff(offsets)
    positions = np.arange(len(values), dtype=np.int64) - np.repeat(offsets[:-1], lengths)
    mixed = _splitmix64(hash_column(values) ^ _splitmix64(positions.view(np.uint64) + _LIST_SALT))
    return _splitmix64(_segment_sums(mixed, offsets) + _splitmix64(lengths.view(np.uint64)))


def _hash_map(column: pa.Array) -> np.ndarray:
    """Order does not matter: a sum over the (key, value) entries, then the map's size."""
    offsets = column.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
    first, last = int(offsets[0]), int(offsets[-1])
    offsets = offsets - first
    keys, items = column.keys.slice(first, last - first), column.items.slice(first, last - first)
    entries = _splitmix64(_splitmix64(hash_column(keys) + _MAP_SALT) * np.uint64(31) + hash_column(items))
    lengths = np.diff(offsets).view(np.uint64)
    return _splitmix64(_segment_sums(entries, offsets) + _splitmix64(lengths + _MAP_SALT))


def hash_rows(batch: pa.RecordBatch, key_columns: Sequence[str]) -> np.ndarray:
    """Combine the hashes of ``key_columns`` row-wise."""
    result: np.ndarray | None = None
    for name in key_columns:
        hashed = hash_column(batch.column(name))
        if result is not None:  # the first key's is 0 * 31 + its hash
            hashed += result * np.uint64(31)
        result = _splitmix64(hashed)
    return np.zeros(batch.num_rows, dtype=np.uint64) if result is None else result


def remix(hashes: np.ndarray, salt: np.uint64) -> np.ndarray:
    """``hashes`` mixed again with ``salt``: independent bits for a second split of rows that one
    hash already routed together (their low bits, say, all equal the partition index)."""
    return _splitmix64(hashes ^ salt)


def hash_partitioner(key_columns: Sequence[str]) -> Partitioner:
    """A partitioner routing each row by the hash of ``key_columns``."""
    keys = list(key_columns)
    if not keys:
        raise ShuffleConfigError("key_columns must name at least one column")

    def route(batch: pa.RecordBatch, num_subpartitions: int) -> np.ndarray:
        for name in keys:
            if batch.schema.get_field_index(name) < 0:
                raise ShuffleConfigError(
                    f"key column {name!r} is not in the batch schema {batch.schema.names}"
                )
        return (hash_rows(batch, keys) % np.uint64(num_subpartitions)).astype(np.int64)

    return route


def column_partitioner(column: str) -> Partitioner:
    """Explicit partition ids: the integer column ``column`` holds each row's subpartition."""

    def route(batch: pa.RecordBatch, num_subpartitions: int) -> np.ndarray:
        ids: np.ndarray = batch.column(column).to_numpy(zero_copy_only=False).astype(np.int64)
        if len(ids) and (ids.min() < 0 or ids.max() >= num_subpartitions):
            raise ShuffleConfigError(
                f"partition id column {column!r} has values outside [0, {num_subpartitions})"
            )
        return ids

    return route
