"""``compat.shuffle_blocks`` on a fake executor: block-manager folders laid out as Spark's
``DiskBlockManager`` lays them (``blockmgr-<uuid>/<"%02x">/``), no JVM."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from spark_plugin.compat.shuffle_blocks import (
    remove_map_status_blocks,
    status_block_layout,
    task_attempt_of,
)

SPARK = "4.2.1"


def block_manager(root: Path) -> Path:
    folder = root / f"blockmgr-{uuid.uuid4()}"
    folder.mkdir(parents=True)
    return folder


def put(folder: Path, sub: str, name: str) -> Path:
    path = folder / sub / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    return path


def remaining(*folders: Path) -> set[str]:
    return {p.name for f in folders for p in f.rglob("*") if p.is_file() or p.is_symlink()}


def test_removes_the_index_first_then_data_and_checksums_of_that_task_only(tmp_path: Path) -> None:
    first, second = block_manager(tmp_path / "disk1"), block_manager(tmp_path / "disk2")
    mine = [
        put(first, "0c", "shuffle_2_7_0.data"),
        put(second, "3f", "shuffle_2_7_0.index"),
        put(first, "21", "shuffle_2_7_0.checksum.ADLER32"),
    ]
    others = [
        put(first, "0c", "shuffle_2_70_0.data"),  # another task: 70, 17
        put(first, "0c", "shuffle_2_17_0.index"),
        put(second, "01", "shuffle_3_8_0.index"),
        put(second, "01", "rdd_7_0"),  # a cached block
        put(first, "21", f"shuffle_2_7_0.index.{uuid.uuid4()}"),  # a writer's temporary file
        put(first, "21", "shuffle_2_7_1.data"),  # not the sort shuffle's reduce id 0
        put(first, "zz", "shuffle_2_7_0.data"),  # not a "%02x" folder
        put(first, "0100", "shuffle_2_7_0.data"),
    ]
    removed = remove_map_status_blocks(f"{first},{second}", 7, SPARK)
    assert [Path(p).name for p in removed] == [
        "shuffle_2_7_0.index",
        "shuffle_2_7_0.data",
        "shuffle_2_7_0.checksum.ADLER32",
    ]
    assert set(removed) == {str(p) for p in mine}
    assert not any(p.exists() for p in mine) and all(p.exists() for p in others)


def test_links_and_folders_not_named_by_spark_are_never_followed(tmp_path: Path) -> None:
    folder = block_manager(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    target = put(outside, "0a", "shuffle_2_7_0.index")
    (folder / "0a").symlink_to(outside / "0a")  # a sub-folder that is a link
    put(folder, "0b", "shuffle_2_7_0.data")
    (folder / "0b" / "shuffle_2_7_0.index").symlink_to(target)  # a file that is a link
    linked_manager = tmp_path / f"blockmgr-{uuid.uuid4()}"
    linked_manager.symlink_to(outside)  # a block-manager folder that is a link
    plain = tmp_path / "local"
    put(plain, "0a", "shuffle_2_7_0.index")  # not a blockmgr-<uuid> folder

    assert remove_map_status_blocks([str(folder), str(linked_manager), str(plain)], 7, SPARK) == []
    assert target.exists() and (folder / "0b" / "shuffle_2_7_0.index").is_symlink()
    assert (plain / "0a" / "shuffle_2_7_0.index").exists()
    relative = os.path.relpath(folder)
    assert remove_map_status_blocks([relative], 7, SPARK) == []
    assert (folder / "0b" / "shuffle_2_7_0.data").exists()


@pytest.mark.parametrize(
    "layout",
    [
        [("0c", "shuffle_2_7_0.data")],  # no index: not what Spark writes
        [("0c", "shuffle_2_7_0.index"), ("0d", "shuffle_3_7_0.index")],  # two map outputs of one task
        [("0c", "shuffle_2_7_0.index"), ("0d", "shuffle_2_7_0.index")],  # one file in two places
        [],
    ],
)
def test_anything_but_one_map_output_with_its_index_removes_nothing(
    tmp_path: Path, layout: list[tuple[str, str]]
) -> None:
    folder = block_manager(tmp_path)
    for sub, name in layout:
        put(folder, sub, name)
    before = remaining(folder)
    assert remove_map_status_blocks([str(folder)], 7, SPARK) == []
    assert remaining(folder) == before


@pytest.mark.parametrize(
    "version, conf, why",
    [
        ("3.5.1", {}, "3.5.1"),
        ("4.4.0", {}, "4.4.0"),
        (SPARK, {"spark.shuffle.useOldFetchProtocol": "true"}, "useOldFetchProtocol"),
        (SPARK, {"spark.shuffle.manager": "org.apache.spark.shuffle.celeborn.SparkShuffleManager"}, "is org"),
        (SPARK, {"spark.shuffle.push.enabled": "true"}, "push-based"),
    ],
)
def test_a_layout_not_checked_removes_nothing(
    tmp_path: Path, version: str, conf: dict[str, str], why: str
) -> None:
    folder = block_manager(tmp_path)
    put(folder, "0c", "shuffle_2_7_0.index")
    put(folder, "0d", "shuffle_2_7_0.data")
    assert why in status_block_layout(version, conf).reason
    assert remove_map_status_blocks([str(folder)], 7, version, conf) == []
    assert remaining(folder) == {"shuffle_2_7_0.index", "shuffle_2_7_0.data"}


@pytest.mark.parametrize("version", ["4.0.5", "4.1.4", "4.2.1", "4.3.0"])
def test_every_supported_minor_with_spark_defaults_is_checked(version: str) -> None:
    assert status_block_layout(version, {}).checked
    assert status_block_layout(
        version,
        {"spark.shuffle.manager": "sort", "spark.shuffle.useOldFetchProtocol": "false"},
    ).checked


def test_task_attempt_ids_come_from_a_status_rows_attempt() -> None:
    assert task_attempt_of("6.22.0") == 22
    assert task_attempt_of("12.4096.3") == 4096
    for bad in ["6.22", "a.b.c", "6.-1.0", "", None, 22]:
        assert task_attempt_of(bad) is None
    for wrong in [True, -1]:
        with pytest.raises(ValueError):
            remove_map_status_blocks([], wrong, SPARK)
