"""Adaptive reduce partitions without Spark: the target size, the packing, the routing keys."""

from __future__ import annotations

import random

import pytest

from arrow_shuffle.errors import ShuffleConfigError
from spark_plugin.shuffle.driver.adaptive import (
    CoalesceSettings,
    coalesce,
    planned_groups,
    route_keys,
    settings_from_sql_conf,
    spark_hash_long,
    target_bytes,
)

MB = 1 << 20


def test_parallelism_first_spreads_small_data_over_the_default_parallelism() -> None:
    settings = CoalesceSettings(advisory_bytes=64 * MB, min_partition_bytes=1 * MB, min_partitions=2)
    assert target_bytes(100 * MB, settings) == 50 * MB  # total / parallelism, under the advisory size
    assert target_bytes(1000 * MB, settings) == 64 * MB  # capped by the advisory size
    assert target_bytes(10_000, settings) == 1 * MB  # never under the minimum partition size
    off = CoalesceSettings(advisory_bytes=64 * MB, parallelism_first=False, min_partitions=8)
    assert target_bytes(100 * MB, off) == 64 * MB


def test_tiny_partitions_pack_into_few_tasks_in_order() -> None:
    settings = CoalesceSettings(advisory_bytes=64 * MB, min_partition_bytes=1 * MB, min_partitions=2)
    sizes = [10_000] * 200  # 2 MB over 200 partitions: target 1 MB
    groups = coalesce(sizes, settings)
    assert [g.start for g in groups] == sorted(g.start for g in groups)
    assert [i for g in groups for i in g] == list(range(200))  # every partition exactly once, in order
    assert len(groups) == 2
    assert all(sum(sizes[i] for i in g) <= 1 * MB for g in groups)


def test_a_hot_partition_is_never_split_and_stays_alone() -> None:
    settings = CoalesceSettings(advisory_bytes=10, min_partition_bytes=0, parallelism_first=False)
    sizes = [3, 3, 100, 3, 3, 3]
    groups = coalesce(sizes, settings)
    assert groups == [range(0, 2), range(2, 3), range(3, 6)]


def test_a_small_last_group_folds_into_the_one_before() -> None:
    settings = CoalesceSettings(advisory_bytes=100, min_partition_bytes=0, parallelism_first=False)
    assert coalesce([60, 50, 10], settings) == [range(0, 1), range(1, 3)]
    assert coalesce([60, 30, 10], settings) == [range(0, 3)]
    assert coalesce([100, 100, 1], settings) == [range(0, 1), range(1, 3)]


def test_a_small_input_is_planned_into_equal_contiguous_groups_from_its_size() -> None:
    settings = CoalesceSettings(advisory_bytes=64 * MB, min_partition_bytes=1 * MB, min_partitions=2)
    assert planned_groups(200, 12 * MB, settings) == [range(0, 100), range(100, 200)]
    assert planned_groups(200, 128 * MB, settings) == [range(0, 100), range(100, 200)]
    assert planned_groups(5, 12 * MB, settings) == [range(0, 3), range(3, 5)]
    assert planned_groups(200, 500_000, settings) == [range(0, 200)]  # under the minimum size: one task
    assert planned_groups(200, 0, settings) == [range(0, 200)]
    assert planned_groups(1, 12 * MB, settings) == [range(0, 1)]  # never more tasks than partitions


def test_an_input_needing_more_tasks_than_the_spread_is_left_to_its_real_sizes() -> None:
    settings = CoalesceSettings(advisory_bytes=64 * MB, min_partition_bytes=1 * MB, min_partitions=2)
    assert planned_groups(200, 128 * MB + 1, settings) is None  # 3 advisory-sized tasks: measure
    off = CoalesceSettings(advisory_bytes=64 * MB, parallelism_first=False)
    assert planned_groups(200, 64 * MB, off) == [range(0, 200)]
    assert planned_groups(200, 64 * MB + 1, off) is None
    with pytest.raises(ShuffleConfigError):
        planned_groups(0, 1, settings)


def test_empty_and_zero_sized_inputs() -> None:
    settings = CoalesceSettings(min_partitions=2)
    assert coalesce([], settings) == []
    assert coalesce([0] * 50, settings) == [range(0, 50)]


@pytest.mark.parametrize("seed", range(20))
def test_packing_invariants_on_random_sizes(seed: int) -> None:
    rng = random.Random(seed)
    sizes = [rng.choice([0, 1, 10, 1000, 10**6]) for _ in range(rng.randint(1, 300))]
    settings = CoalesceSettings(
        advisory_bytes=rng.randint(1, 10**6), min_partition_bytes=rng.randint(0, 1000), min_partitions=2
    )
    groups = coalesce(sizes, settings)
    assert [i for g in groups for i in g] == list(range(len(sizes)))
    target = target_bytes(sum(sizes), settings)
    for g in groups[:-1]:  # a group over the target holds one partition, or is the merged tail
        assert sum(sizes[i] for i in g) <= target or len(g) == 1


def test_settings_follow_sparks_keys_and_name_a_bad_value() -> None:
    conf = {
        "spark.sql.adaptive.advisoryPartitionSizeInBytes": "32m",
        "spark.sql.adaptive.coalescePartitions.minPartitionSize": "512k",
        "spark.sql.adaptive.coalescePartitions.parallelismFirst": "false",
        "spark.sql.adaptive.coalescePartitions.minPartitionNum": "7",
    }
    assert settings_from_sql_conf(conf, 2) == CoalesceSettings(32 * MB, 512 << 10, False, 7)
    assert settings_from_sql_conf({}, 3) == CoalesceSettings(64 * MB, 1 * MB, True, 3)
    assert (
        settings_from_sql_conf(
            {"spark.sql.adaptive.advisoryPartitionSizeInBytes": "67108864"}, 1
        ).advisory_bytes
        == 64 * MB
    )
    with pytest.raises(ShuffleConfigError, match="64 lots"):
        settings_from_sql_conf({"spark.sql.adaptive.advisoryPartitionSizeInBytes": "64 lots"}, 2)


def test_sparks_hash_of_a_bigint_is_reproduced() -> None:
    # Values printed by Spark 4.0's ``SELECT hash(0L), hash(1L), hash(-1L), hash(1099511627776L)``;
    # the Spark tests check every routing key against a live HashPartitioning too.
    assert [spark_hash_long(v) for v in (0, 1, -1, 1 << 40)] == [
        -1670924195,
        -1712319331,
        -939490007,
        -1596767687,
    ]


@pytest.mark.parametrize("n", [1, 2, 5, 200, 1009])
def test_route_keys_reach_every_task_once(n: int) -> None:
    keys = route_keys(n)
    assert len(keys) == n == len(set(keys))
    assert [spark_hash_long(k) % n for k in keys] == list(range(n))
    with pytest.raises(ShuffleConfigError):
        route_keys(0)
