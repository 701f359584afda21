"""Adaptive reduce partitions: arrowbeat's counterpart of AQE's shuffle-partition coalescing.

Once the map side has run, the bytes each reduce partition will read are known. Spark's AQE then
packs *contiguous* reduce partitions into one task until the next would push it past a target
size, and folds a last, small group into its neighbour; reduce partitions are never split, so a
key (which lives in exactly one reduce partition) is never split either. The target follows
Spark's own settings (``spark.sql.adaptive.advisoryPartitionSizeInBytes``,
``...coalescePartitions.minPartitionSize``, ``...parallelismFirst``, ``...minPartitionNum``):
with ``parallelismFirst`` (Spark's default) the target shrinks so that the data spreads over at
least the application's default parallelism, but never below ``minPartitionSize``.

Measuring the real sizes costs a small input more than its shuffle: the map side runs as a job of
its own, its status rows are cached and a further stage stamps them (``planning._eager_map_side``),
seconds in all. When the optimizer's size of the input (``compat.plan_stats``) already says AQE's
target would spread it over no more tasks than the parallelism it aims at, the tasks follow from
that size (``planned_groups``): contiguous, equal ranges of reduce partitions, the map side left
lazy in one job with the reduce side. Only under ``spark.arrowbeat.shuffle.adaptive=auto``
(``true`` always measures), and never on an estimate that may be low (``PlanSize.grows``).

Pure functions of sizes and settings, so they are tested without Spark.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from arrow_shuffle.errors import ShuffleConfigError
from spark_plugin.settings.units import parse_bytes

SMALL_GROUP_FACTOR = 0.2
"""A last group under this fraction of the target is merged into the group before it ..."""
MERGED_GROUP_FACTOR = 1.2
"""... when the merged group stays under this multiple of the target (Spark's factors)."""


@dataclass(frozen=True)
class CoalesceSettings:
    advisory_bytes: int = 64 << 20
    min_partition_bytes: int = 1 << 20
    parallelism_first: bool = True
    min_partitions: int = 1
    """``minPartitionNum`` if set, else the application's default parallelism."""

    def __post_init__(self) -> None:
        if self.advisory_bytes < 1 or self.min_partition_bytes < 0 or self.min_partitions < 1:
            raise ShuffleConfigError(f"invalid coalescing settings: {self}")


def target_bytes(total: int, settings: CoalesceSettings) -> int:
    """The size a coalesced reduce task aims at, as Spark's AQE computes it."""
    if not settings.parallelism_first:
        return settings.advisory_bytes
    spread = math.ceil(total / settings.min_partitions) if total else 0
    return max(min(spread, settings.advisory_bytes), settings.min_partition_bytes, 1)


def coalesce(sizes: Sequence[int], settings: CoalesceSettings) -> list[range]:
    """Contiguous groups of reduce partitions ``0 .. len(sizes)-1``, each one task's input.

    Every partition is in exactly one group, in order; a group never exceeds the target unless a
    single partition does (a hot key: it is never split)."""
    if not sizes:
        return []
    target = target_bytes(sum(sizes), settings)
    groups: list[range] = []
    start, size = 0, 0
    for index, part in enumerate(sizes):
        if index > start and size + part > target:
            groups.append(range(start, index))
            start, size = index, 0
        size += part
    groups.append(range(start, len(sizes)))
    if len(groups) > 1:
        last = sum(sizes[i] for i in groups[-1])
        before = sum(sizes[i] for i in groups[-2])
        if last < SMALL_GROUP_FACTOR * target and last + before <= MERGED_GROUP_FACTOR * target:
            groups[-2:] = [range(groups[-2].start, groups[-1].stop)]
    return groups


def planned_groups(
    num_partitions: int, estimated_bytes: int, settings: CoalesceSettings
) -> list[range] | None:
    """Contiguous groups of ``num_partitions`` reduce partitions planned from an input size alone,
    or None when the size needs more tasks than ``settings.min_partitions`` (then only the real
    sizes pack well: a hot key may fill one partition).

    As many groups as AQE's target makes of ``estimated_bytes`` (at most ``num_partitions``), of
    equal counts of partitions: with the size under the spread, a hash partitioner fills them
    about evenly, and AQE would pack them into that many tasks too."""
    if num_partitions < 1 or estimated_bytes < 0:
        raise ShuffleConfigError(f"cannot plan {num_partitions} partitions of {estimated_bytes} bytes")
    target = target_bytes(estimated_bytes, settings)
    tasks = max(1, math.ceil(estimated_bytes / target))
    if tasks > max(1, settings.min_partitions):
        return None
    tasks = min(tasks, num_partitions)
    step, extra = divmod(num_partitions, tasks)
    groups, start = [], 0
    for task in range(tasks):
        stop = start + step + (1 if task < extra else 0)
        groups.append(range(start, stop))
        start = stop
    return groups


def settings_from_sql_conf(
    conf: Mapping[str, str], default_parallelism: int | Callable[[], int]
) -> CoalesceSettings:
    """The coalescing settings from the session's SQL conf (Spark's keys and defaults).

    ``default_parallelism`` may be a function, called only when the settings need it (with
    ``parallelismFirst`` and no ``minPartitionNum``): finding it may cost a Spark job."""
    prefix = "spark.sql.adaptive."
    try:
        advisory = parse_bytes(conf.get(prefix + "advisoryPartitionSizeInBytes", "64m"))
        min_size = parse_bytes(conf.get(prefix + "coalescePartitions.minPartitionSize", "1m"))
        first = conf.get(prefix + "coalescePartitions.parallelismFirst", "true").strip().lower() == "true"
        explicit = conf.get(prefix + "coalescePartitions.minPartitionNum", "")
        if explicit:
            min_partitions = int(explicit)
        elif not first:
            min_partitions = 1  # unused: the target is the advisory size
        else:
            min_partitions = default_parallelism() if callable(default_parallelism) else default_parallelism
    except ValueError as exc:
        raise ShuffleConfigError(f"cannot read Spark's adaptive coalescing settings: {exc}") from exc
    return CoalesceSettings(advisory, min_size, first, max(1, min_partitions))


# -- routing status rows to reduce tasks -----------------------------------------------------------
# Spark's ``repartition(n, col)`` sends a bigint ``v`` to partition ``pmod(murmur3_x86_32(v, 42), n)``
# (``HashPartitioning``: Murmur3 over the long's low then high 32-bit word, seed 42). Knowing that,
# the driver finds, for each task ``t``, a bigint that lands in ``t`` without running a Spark job.
_M32 = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def _mix_k1(k1: int) -> int:
    k1 = (k1 * 0xCC9E2D51) & _M32
    return (_rotl(k1, 15) * 0x1B873593) & _M32


def _mix_h1(h1: int, k1: int) -> int:
    h1 = _rotl(h1 ^ k1, 13)
    return (h1 * 5 + 0xE6546B64) & _M32


def spark_hash_long(value: int, seed: int = 42) -> int:
    """Spark's ``hash(bigint)``: Murmur3 x86 32-bit of the 8-byte value, as a signed int."""
    unsigned = value & 0xFFFFFFFFFFFFFFFF
    h1 = _mix_h1(seed & _M32, _mix_k1(unsigned & _M32))
    h1 = _mix_h1(h1, _mix_k1(unsigned >> 32)) ^ 8
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & _M32
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & _M32
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


def route_keys(n: int) -> tuple[int, ...]:
    """For each task ``t < n``, the smallest bigint >= 0 that ``repartition(n, col)`` sends to ``t``."""
    if n < 1:
        raise ShuffleConfigError(f"cannot route to {n} partitions")
    found: dict[int, int] = {}
    value = 0
    while len(found) < n:
        found.setdefault(spark_hash_long(value) % n, value)  # Python's % is pmod for n > 0
        value += 1
    return tuple(found[t] for t in range(n))
