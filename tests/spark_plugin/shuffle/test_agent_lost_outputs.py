"""The agent notices lost map outputs, without Spark: a ``stage`` naming a file of ours that is
gone fails at once, ``report_lost`` answers whether named files are gone, and either tells
``on_outputs_lost`` (once). Paths outside the agent's directory are refused, never looked at."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from arrow_shuffle import ControlRequestError, MapOutputLostError, ShuffleError
from spark_plugin.shuffle.agent.service import MapOutputService
from spark_plugin.shuffle.map_output import MapOutputWriter
from spark_plugin.shuffle.worker.agent_client import MapOutputClient

SECRET = "lost-outputs-secret-0123456789"
SCHEMA = pa.schema([("k", pa.int64())])


@pytest.fixture
def lost() -> list[str]:
    return []


@pytest.fixture
def service(tmp_path: Path, lost: list[str]) -> Iterator[MapOutputService]:
    svc = MapOutputService(
        "app-l", "2", SECRET, str(tmp_path / "root"), jvm_pid=6161, on_outputs_lost=lost.append
    )
    yield svc
    svc.close()


def write_map(svc: MapOutputService, shuffle: int, m: int) -> tuple[str, Any]:
    path = str(Path(svc.dir) / f"s{shuffle}" / f"m{m}.arrows")
    writer = MapOutputWriter(path, SCHEMA, ["k"], 1, 1 << 20)
    writer.write(pa.record_batch([pa.array(range(100), pa.int64())], schema=SCHEMA))
    return path, writer.finish()[0].segments


def test_staging_a_vanished_output_fails_at_once_and_tells_the_jvm_once(
    service: MapOutputService, lost: list[str]
) -> None:
    kept, kept_segments = write_map(service, 1, 0)
    gone, gone_segments = write_map(service, 1, 1)
    os.unlink(gone)
    with MapOutputClient(service.control_address, SECRET, "test") as client:
        with pytest.raises(
            ShuffleError, match=rf"refused 'stage': map outputs \['{gone}'\] of shuffle 1 are gone"
        ):
            client.stage(1, 0, SCHEMA, [(kept, kept_segments), (gone, gone_segments)])
        assert lost == ["files-missing"]
        with pytest.raises(ShuffleError, match="are gone"):
            client.stage(1, 0, SCHEMA, [(gone, gone_segments)])
        assert lost == ["files-missing"]  # told once per service
        client.unstage(client.stage(1, 0, SCHEMA, [(kept, kept_segments)]))  # what is there still streams
    with pytest.raises(MapOutputLostError):  # the same, called in the agent's process
        service.stage(1, 0, SCHEMA, [(gone, gone_segments)])
    assert service.metrics()["shuffle_streams_open"] == 0


def test_report_lost_answers_whether_files_are_gone(
    service: MapOutputService, lost: list[str], tmp_path: Path
) -> None:
    kept, _ = write_map(service, 2, 0)
    gone, _ = write_map(service, 2, 1)
    outside = tmp_path / "elsewhere.arrows"
    outside.write_bytes(b"not ours")
    with MapOutputClient(service.control_address, SECRET, "test") as client:
        assert client.report_lost(2, [kept]) is False and lost == []
        os.unlink(gone)
        assert client.report_lost(2, [kept, gone]) is True and lost == ["files-missing"]
        with pytest.raises(ControlRequestError, match=r"refused 'report_lost'.* is not inside"):
            client.report_lost(2, [kept, str(outside)])
        assert client.report_lost(2, [gone]) is True and lost == ["files-missing"]


def test_a_failing_hook_does_not_break_the_agent(tmp_path: Path) -> None:
    def hook(reason: str) -> None:
        raise RuntimeError("the JVM is gone")

    svc = MapOutputService("app-l", "3", SECRET, str(tmp_path / "root"), jvm_pid=6162, on_outputs_lost=hook)
    try:
        gone, _ = write_map(svc, 3, 0)
        os.unlink(gone)
        with MapOutputClient(svc.control_address, SECRET, "test") as client:
            assert client.report_lost(3, [gone]) is True
            assert client.metrics()["shuffle_streams_open"] == 0  # still serving
    finally:
        svc.close()


def test_outputs_the_agent_deleted_on_purpose_are_not_lost(
    service: MapOutputService, lost: list[str]
) -> None:
    """Released or swept by the TTL: a late reader gets an error, the executor is not replaced."""
    path, segments = write_map(service, 4, 0)
    assert service.release_shuffle(4) > 0 and not os.path.exists(path)
    with MapOutputClient(service.control_address, SECRET, "test") as client:
        assert client.report_lost(4, [path]) is False
        with pytest.raises(ShuffleError, match="are gone"):
            client.stage(4, 0, SCHEMA, [(path, segments)])
    assert lost == []
    other, _ = write_map(service, 5, 0)  # a shuffle this agent never deleted: lost, as before
    os.unlink(other)
    assert service.report_lost(5, [other]) is True and lost == ["files-missing"]
