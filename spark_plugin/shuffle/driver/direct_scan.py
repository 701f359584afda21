"""A shuffle's map side over Parquet files: the map task reads the files with pyarrow.

Over ``spark.read.parquet(...)`` (and a ``select`` of its columns), Spark's map side is its JVM
scan: Parquet pages decoded into rows, the rows converted back to Arrow for the Python worker
(``ArrowPythonRunner``), then arrowbeat's map writer. The rows-to-Arrow step alone is most of a
map task (7.2 s of JVM CPU over 8 tasks at 20 M rows, against 0.14-0.29 s of the task's own
Python). Dask's map side never has it: pyarrow decodes the pages straight into Arrow. When the
input is nothing but Parquet files (``compat.parquet_relation``) whose columns pyarrow reads as
exactly the Arrow types Spark would hand the worker, arrowbeat does the same: one map task per
split of the files' row groups (``spark.range`` carries the split numbers), each reading its
row groups with pyarrow. The result is the same rows; only who decodes them changes.

Planned on the driver (``plan_direct_scan``: each file's footer read once, row groups packed
into tasks the way Spark packs file splits), read in the map task (``scan_function``). Anything
the check cannot vouch for keeps Spark's scan and says why at DEBUG: files off the local file
system, a type pyarrow reads differently (INT96 timestamps, nested columns), files a Spark 2.x
wrote with the legacy calendar, options that change how rows are read, more than
``MAX_FILES`` files. ``spark.arrowbeat.shuffle.directScan=false`` turns it off.
"""

from __future__ import annotations

import heapq
import logging
import math
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.parquet as pq

from arrow_shuffle.errors import ShuffleError
from spark_plugin.compat.parquet_relation import parquet_relation
from spark_plugin.settings.units import parse_bytes
from spark_plugin.shuffle.driver.session import conf_value, default_parallelism, sql_conf, sql_flag

log = logging.getLogger("arrowbeat.shuffle")

MAX_FILES = 4096
"""Beyond this many files the driver's footer reads (about 1 ms each) are left to Spark's scan."""

BATCH_ROWS = 65536
"""Rows per batch read: pyarrow's own default, the map writer partitions each batch at once."""

KEPT_OPTIONS = frozenset(
    {
        "path",
        "paths",
        "mergeschema",
        "recursivefilelookup",
        "pathglobfilter",
        "modifiedbefore",
        "modifiedafter",
    }
)
"""Read options that choose files or the schema only: their effect is already in the listed files
and ``df.schema``. Any other option (``datetimeRebaseMode``, ``ignoreCorruptFiles``...) may
change rows: Spark's scan keeps it."""

LEGACY_CALENDAR_KEYS = (b"org.apache.spark.legacyDateTime", b"org.apache.spark.legacyINT96")
"""Footer keys of files whose dates Spark rebases from the Julian calendar when it reads them."""
SPARK_VERSION_KEY = b"org.apache.spark.version"
"""Spark's writer version in a footer: below 3.0 its dates are Julian (rebased on read, no key)."""
REBASE_MODE = "spark.sql.parquet.datetimeRebaseModeInRead"
"""How Spark reads dates and timestamps of files no Spark wrote: only ``CORRECTED`` reads them as
they are (``LEGACY`` rebases, ``EXCEPTION`` fails on ancient values)."""
CRYPTO_FACTORY = "spark.hadoop.parquet.crypto.factory.class"
"""Parquet modular encryption on: Spark decrypts columns with keys pyarrow does not have."""

_ROW_CHANGING_FLAGS = ("spark.sql.files.ignoreCorruptFiles", "spark.sql.files.ignoreMissingFiles")
"""Session settings under which Spark's scan reads other rows than pyarrow."""

FIELD_ID_READ = "spark.sql.parquet.fieldId.read.enabled"
FIELD_ID_KEY = "parquet.field.id"
"""With ``FIELD_ID_READ`` on (Delta's extension turns it on), Spark matches a column that carries
``FIELD_ID_KEY`` in its metadata to the file's column of that id, not of that name."""

Split = tuple[str, tuple[int, ...]]
"""One file's local path and the row groups of it that a task reads."""


@dataclass(frozen=True)
class DirectScan:
    """The map tasks of a shuffle over Parquet files: ``tasks[i]`` is what task ``i`` reads."""

    schema_ipc: bytes
    """The Arrow schema the footers were checked against, which the tasks read as (IPC bytes)."""
    tasks: tuple[tuple[Split, ...], ...]
    files: int
    row_groups: int


def plan_direct_scan(
    df: Any, schema: pa.Schema, chained: bool = False, session: Any = None
) -> DirectScan | str:
    """How map tasks read ``df``'s Parquet files themselves, or why they should not (a reason).

    ``chained``: a user's ``map_in_arrow``/``map_in_pandas`` function reads the batches first, so
    they must also carry the labels Spark's would (a timestamp's session zone, large strings)."""
    relation = parquet_relation(df)
    if relation.why_not:
        return relation.why_not
    unknown = sorted(set(relation.options) - KEPT_OPTIONS)
    if unknown:
        return f"read options {unknown} may change rows"
    spark = session if session is not None else df.sparkSession  # the caller's view, if it has one
    for flag in _ROW_CHANGING_FLAGS:
        if sql_flag(spark, flag, "false"):
            return f"{flag}=true"
    if sql_flag(spark, FIELD_ID_READ, "false"):
        by_id = [f.name for f in df.schema.fields if FIELD_ID_KEY in (f.metadata or {})]
        if by_id:
            return f"{FIELD_ID_READ}=true and columns {by_id} are matched by Parquet field id"
    if conf_value(spark, CRYPTO_FACTORY, ""):
        return f"{CRYPTO_FACTORY} is set (encrypted columns)"
    if chained:
        why = _chained_labels(spark, schema)
        if why:
            return why
    case_sensitive = sql_flag(spark, "spark.sql.caseSensitive", "false")
    dated = any(pa.types.is_date(f.type) or pa.types.is_timestamp(f.type) for f in schema)
    corrected = not dated or sql_conf(spark, REBASE_MODE, "CORRECTED").strip().upper() == "CORRECTED"
    if not relation.files:
        return "no files to read"
    if len(relation.files) > MAX_FILES:
        return f"{len(relation.files)} files (more than {MAX_FILES} footers to read on the driver)"
    paths = []
    for uri in relation.files:
        parsed = urlparse(uri)
        if parsed.scheme not in ("file", "") or parsed.netloc not in ("", "localhost"):
            return f"{uri} is not on the local file system"
        path = unquote(parsed.path)
        if _data_file(path):
            paths.append(path)
    units: list[tuple[int, str, int]] = []  # (bytes, path, row group)
    file_bytes = 0
    for path in paths:
        why, groups, size = _file_groups(path, schema, case_sensitive, corrected)
        if why:
            return why
        units.extend((weight, path, group) for group, weight in groups)
        file_bytes += size
    if not units:
        return "the files hold no rows"
    try:
        tasks = _pack(units, file_bytes, len(paths), spark)
    except ValueError as exc:
        return f"a file-split setting is malformed ({exc})"
    return DirectScan(schema.serialize().to_pybytes(), tasks, len(paths), len(units))


def _data_file(path: str) -> bool:
    """Whether Spark's scan reads the file: its listing also holds summary files (``_metadata``,
    ``_common_metadata``) that its scan skips with every name starting ``_`` (but a partition
    directory's ``k=v``) or ``.``, and empty files."""
    name = os.path.basename(path)
    if name.startswith(".") or (name.startswith("_") and "=" not in name):
        return False
    try:
        return os.path.getsize(path) > 0
    except OSError:
        return True  # the footer read says why it cannot be read


def _chained_labels(spark: Any, schema: pa.Schema) -> str:
    """Why a chained function would see other Arrow labels than Spark hands it, or ``""``."""
    if any(pa.types.is_timestamp(f.type) and f.type.tz for f in schema):
        return "a chained function reads timestamps, which Spark labels with the session's zone"
    strings = any(pa.types.is_string(f.type) or pa.types.is_binary(f.type) for f in schema)
    if strings and sql_flag(spark, "spark.sql.execution.arrow.useLargeVarTypes", "false"):
        return "a chained function reads strings, which Spark hands it as large strings here"
    return ""


def _file_groups(
    path: str, schema: pa.Schema, case_sensitive: bool = True, corrected: bool = True
) -> tuple[str, list[tuple[int, int]], int]:
    """``(why not, [(row group, bytes)...], file bytes)`` of one file, read from its footer.

    ``case_sensitive`` False: Spark refuses a file with two columns whose names differ in case
    only; ``corrected`` False: a file no Spark wrote with dates or timestamps, which this session
    reads rebased (``REBASE_MODE``)."""
    try:
        with open(path, "rb") as handle:
            metadata = pq.read_metadata(handle)
            size = handle.seek(0, 2)
    except (OSError, pa.ArrowException) as exc:
        return f"{path} is not readable here ({exc})", [], 0
    footer = metadata.metadata or {}
    legacy = [key.decode() for key in LEGACY_CALENDAR_KEYS if key in footer]
    if legacy:
        return f"{path} was written with Spark's legacy calendar ({legacy[0]})", [], 0
    writer = footer.get(SPARK_VERSION_KEY)
    if writer is not None and _version(writer) < (3, 0):
        return f"{path} was written by Spark {writer.decode(errors='replace')} (Julian dates)", [], 0
    if writer is None and not corrected:
        return f"{path}: dates or timestamps of a file no Spark wrote, rebased under {REBASE_MODE}", [], 0
    try:
        file_schema = metadata.schema.to_arrow_schema()
    except pa.ArrowException as exc:
        return f"{path}'s schema has no Arrow form here ({exc})", [], 0
    if not case_sensitive:
        folded = [name.lower() for name in file_schema.names]
        clashing = sorted({f.name for f in schema if folded.count(f.name.lower()) > 1})
        if clashing:
            return f"{path} has columns differing in case only ({clashing})", [], 0
    for want in schema:
        index = file_schema.get_field_index(want.name)
        if index < 0:
            return f"{path} has no single column {want.name!r}", [], 0
        got = file_schema.field(index).type
        if pa.types.is_nested(want.type) or got != want.type:
            return f"{path}: column {want.name!r} reads as {got} here, Spark hands workers {want.type}", [], 0
    groups = [
        (i, max(1, metadata.row_group(i).total_byte_size))
        for i in range(metadata.num_row_groups)
        if metadata.row_group(i).num_rows > 0
    ]
    return "", groups, size


def _version(text: bytes) -> tuple[int, ...]:
    """``b"2.4.8"`` as ``(2, 4, 8)``; an unreadable version as the oldest."""
    parts = []
    for part in text.decode(errors="replace").split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts) or (0,)


def _pack(
    units: list[tuple[int, str, int]], file_bytes: int, files: int, spark: Any
) -> tuple[tuple[Split, ...], ...]:
    """Row groups packed into tasks as Spark packs file splits (``FilePartition.maxSplitBytes``:
    at most ``spark.sql.files.maxPartitionBytes`` each, fewer bytes per task when the input would
    not give every core one), each task's groups in file order."""
    open_cost = parse_bytes(sql_conf(spark, "spark.sql.files.openCostInBytes", "4m"))
    max_bytes = parse_bytes(sql_conf(spark, "spark.sql.files.maxPartitionBytes", "128m"))
    min_tasks_text = sql_conf(spark, "spark.sql.files.minPartitionNum", "")
    min_tasks = int(min_tasks_text) if min_tasks_text else default_parallelism(spark)
    total = file_bytes + files * open_cost
    split_bytes = min(max_bytes, max(open_cost, total // max(1, min_tasks)))
    count = max(1, min(len(units), math.ceil(total / max(1, split_bytes))))
    # Largest first onto the least loaded task: even tasks when row groups differ in size.
    scale = file_bytes / max(1, sum(weight for weight, _, _ in units))
    load = [(0, task) for task in range(count)]
    chosen: list[list[tuple[str, int]]] = [[] for _ in range(count)]
    for weight, path, group in sorted(units, key=lambda unit: -unit[0]):
        bytes_, task = heapq.heappop(load)
        chosen[task].append((path, group))
        heapq.heappush(load, (bytes_ + int(weight * scale) + 1, task))
    order = {path: i for i, path in enumerate(dict.fromkeys(path for _, path, _ in units))}
    tasks = []
    for picked in chosen:
        by_file: dict[str, list[int]] = {}
        for path, group in sorted(picked, key=lambda pg: (order[pg[0]], pg[1])):
            by_file.setdefault(path, []).append(group)
        tasks.append(tuple((path, tuple(groups)) for path, groups in by_file.items()))
    return tuple(task for task in tasks if task)


def scan_function(
    scan: DirectScan, batch_rows: int = BATCH_ROWS
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The map task's reader: for each split number it receives, that split's row groups, as
    batches of ``schema`` (the Arrow schema Spark's scan would have handed the worker) of at most
    ``batch_rows`` rows (a chained function gets ``maxRecordsPerBatch``, as from Spark)."""

    def read(numbers: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        schema = pa.ipc.read_schema(pa.py_buffer(scan.schema_ipc))
        for batch in numbers:
            for task in batch.column(0).to_pylist():
                for path, groups in scan.tasks[task]:
                    yield from _read_split(path, groups, schema, batch_rows)

    return read


def _read_split(
    path: str, groups: tuple[int, ...], schema: pa.Schema, batch_rows: int
) -> Iterator[pa.RecordBatch]:
    with pq.ParquetFile(path) as reader:
        for batch in reader.iter_batches(
            batch_size=batch_rows, row_groups=list(groups), columns=schema.names, use_threads=False
        ):
            columns = [batch.column(name) for name in schema.names]  # the file's order may differ
            if [column.type for column in columns] != schema.types:
                raise ShuffleError(
                    f"{path} changed since the query was planned: its columns read as "
                    f"{batch.schema}, expected {schema}"
                )
            yield pa.RecordBatch.from_arrays(columns, schema=schema)


__all__ = ["DirectScan", "plan_direct_scan", "scan_function"]
