"""Routing rows to subpartitions: a deterministic, vectorised hash of key columns.

Python's ``hash()`` is salted per process, so it cannot route rows consistently across
executors. Here integers, booleans, temporals and floats are mixed with splitmix64 in numpy;
strings and binaries are dictionary-encoded and each distinct value hashed once with
BLAKE2b. The result depends only on the values, never on the process.
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


def _splitmix64(x: np.ndarray) -> np.ndarray:
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    result: np.ndarray = x ^ (x >> np.uint64(31))
    return result


def _bytes_hash(value: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(value, digest_size=8).digest(), "little")


def hash_column(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """One stable uint64 per value of ``column`` (nulls hash to a fixed constant)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    kind = column.type
    valid = np.ones(len(column), dtype=bool) if column.null_count == 0 else column.is_valid().to_numpy(False)
    if pa.types.is_dictionary(kind):
        column = column.cast(kind.value_type)
        kind = column.type
    if pa.types.is_floating(kind):
        floats = pc.fill_null(column.cast(pa.float64()), 0.0).to_numpy(zero_copy_only=False)
        floats = np.where(floats == 0.0, 0.0, floats)  # -0.0 == 0.0
        floats = np.where(np.isnan(floats), np.nan, floats)
        hashed = _splitmix64(floats.view(np.uint64))
    elif pa.types.is_integer(kind) or pa.types.is_boolean(kind) or pa.types.is_temporal(kind):
        if pa.types.is_temporal(kind):
            column = column.view(pa.int64()) if kind.bit_width == 64 else column.cast(pa.int64())
        if column.type != pa.int64():
            column = column.cast(pa.int64())
        if column.null_count:
            column = pc.fill_null(column, 0)
        ints = column.to_numpy(zero_copy_only=False)  # a view when int64 without nulls
        hashed = _splitmix64(ints.view(np.uint64))
    elif (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or (pa.types.is_large_binary(kind))
    ):
        encoded = pc.dictionary_encode(column)
        dictionary = encoded.dictionary.cast(pa.large_binary()).to_pylist()
        per_value = np.fromiter((_bytes_hash(v) for v in dictionary), dtype=np.uint64, count=len(dictionary))
        indices = pc.fill_null(encoded.indices, 0).to_numpy(zero_copy_only=False)
        hashed = per_value[indices] if len(per_value) else np.zeros(len(column), dtype=np.uint64)
    else:
        raise ShuffleConfigError(
            f"cannot hash-partition on a column of type {kind}; use an explicit partitioner"
        )
    result: np.ndarray = np.where(valid, hashed, _NULL_HASH)
    return result


def hash_rows(batch: pa.RecordBatch, key_columns: Sequence[str]) -> np.ndarray:
    """Combine the hashes of ``key_columns`` row-wise."""
    result = np.zeros(batch.num_rows, dtype=np.uint64)
    for name in key_columns:
        result = _splitmix64(result * np.uint64(31) + hash_column(batch.column(name)))
    return result


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
