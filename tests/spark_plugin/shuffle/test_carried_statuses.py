"""Status rows are trusted only on the executor that holds their files, without Spark.

An adaptive shuffle's status rows are cached where their map task ran; Spark shuffles a cached
partition from wherever it reads it (off its owner once the locality wait runs out), so an
executor may *carry* rows naming another's map outputs. When those outputs are lost, replacing
their owner leaves the carried rows behind and every retry reads them again. Here a reducer that
finds them lost tells the carrier's agent too, whose JVM has Spark replace it: the fetch failure
that recomputes. Real ``MapOutputService``s answer over their control channels; the JVM is a list
of the reasons each agent's ``on_outputs_lost`` was told.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from arrow_shuffle import MapOutputLostError
from arrow_shuffle.errors import ShuffleError
from spark_plugin.shuffle.agent.service import MapOutputService
from spark_plugin.shuffle.map_output import MapOutputWriter
from spark_plugin.shuffle.plan import CARRIER_SCHEMA, STATUS_SCHEMA, ShufflePlan
from spark_plugin.shuffle.worker.agent_client import MapOutputClient
from spark_plugin.shuffle.worker.map_task import carry_function
from spark_plugin.shuffle.worker.output_recovery import lost_outputs, stale_carriers
from spark_plugin.shuffle.worker.reduce_task import recomputed_outputs, statuses_by_reducer

SECRET = "carried-statuses-secret-0123456789"
SCHEMA = pa.schema([("k", pa.int64())])
APP = "app-c"


class Agent:
    """One executor's agent and what its JVM was told."""

    def __init__(self, root: Path, executor: str, jvm_pid: int) -> None:
        self.told: list[str] = []
        self.service = MapOutputService(
            APP, executor, SECRET, str(root), jvm_pid=jvm_pid, on_outputs_lost=self.told.append
        )

    def row(self, path: str, segments: Any, carrier: Agent | None = None) -> dict[str, Any]:
        """The status row of reduce partition 0 of ``path``, shuffled from ``carrier`` if given."""
        host, data_port = self.service.data_address
        row = {
            "reduce": 0,
            "map": 0,
            "attempt": "3.1.0",
            "executor": self.service.executor_id,
            "host": host,
            "data_port": data_port,
            "control_port": self.service.control_address[1],
            "path": path,
            "segments": json.dumps(segments),
            "bytes": 100,
        }
        if carrier is not None:
            row |= {
                "carrier": carrier.service.executor_id,
                "carrier_host": carrier.service.control_address[0],
                "carrier_port": carrier.service.control_address[1],
            }
        return row


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[tuple[Agent, Agent]]:
    """The owner (executor 1, holds the files) and the carrier (executor 2)."""
    owner, carrier = Agent(tmp_path / "a", "1", 7101), Agent(tmp_path / "b", "2", 7102)
    yield owner, carrier
    owner.service.close()
    carrier.service.close()


def write_map(agent: Agent, shuffle: int) -> tuple[str, Any]:
    path = str(Path(agent.service.dir) / f"s{shuffle}" / "m0.arrows")
    writer = MapOutputWriter(path, SCHEMA, ["k"], 1, 1 << 20)
    writer.write(pa.record_batch([pa.array(range(100), pa.int64())], schema=SCHEMA))
    return path, writer.finish()[0].segments


def plan(shuffle: int, root: str = "") -> ShufflePlan:
    return ShufflePlan(
        APP, shuffle, root, SECRET, ("k",), 1, SCHEMA.serialize().to_pybytes(), (0,), lost_wait_s=0.2
    )


def test_outputs_lost_under_carried_rows_replace_the_carrier_too(agents: tuple[Agent, Agent]) -> None:
    """The owner's files are gone: the owner is replaced (``files-missing``) and so is the executor
    carrying its rows (``rows-stale``), so that Spark drops those rows and recomputes the map."""
    owner, carrier = agents
    path, segments = write_map(owner, 1)
    os.unlink(path)
    error = lost_outputs(plan(1), [owner.row(path, segments, carrier)], "read failed")
    assert isinstance(error, MapOutputLostError)
    assert owner.told == ["files-missing"]
    assert carrier.told == ["rows-stale"]


def test_an_unreachable_owner_under_carried_rows_replaces_the_carrier(agents: tuple[Agent, Agent]) -> None:
    owner, carrier = agents
    path, segments = write_map(owner, 2)
    row = owner.row(path, segments, carrier)
    owner.service.close()  # the owner's executor died (its JVM reported its own loss)
    lost_outputs(plan(2), [row], "read failed")
    assert carrier.told == ["rows-stale"]


def test_rows_carried_by_their_owner_or_outputs_still_there_replace_nobody_else(
    agents: tuple[Agent, Agent],
) -> None:
    owner, carrier = agents
    path, segments = write_map(owner, 3)
    lost_outputs(plan(3), [owner.row(path, segments, carrier)], "a read failed, the files are there")
    assert owner.told == [] and carrier.told == []  # nothing lost: the retry reads them again
    os.unlink(path)
    lost_outputs(plan(3), [owner.row(path, segments, owner), owner.row(path, segments)], "read failed")
    assert owner.told == ["files-missing"] and carrier.told == []  # the rows went with their owner


def test_stale_carriers_names_each_carrier_once_with_the_owners_it_carries(
    agents: tuple[Agent, Agent],
) -> None:
    owner, carrier = agents
    rows = [
        owner.row("/x/a.arrows", [], carrier),
        owner.row("/x/b.arrows", [], carrier),
        owner.row("/x/c.arrows", []),
    ]
    lost = {(rows[0]["host"], rows[0]["control_port"])}
    assert stale_carriers(rows, lost) == {carrier.service.control_address: ["1"]}
    assert stale_carriers(rows, set()) == {}


def test_the_carriers_agent_refuses_rows_of_its_own_or_of_a_released_shuffle(
    agents: tuple[Agent, Agent],
) -> None:
    _, carrier = agents
    with MapOutputClient(carrier.service.control_address, SECRET, "test") as client:
        assert client.carried_lost(4, ["2"]) is False  # its own outputs: report_lost checks those
        carrier.service.release_shuffle(4)
        assert client.carried_lost(4, ["1"]) is False  # the query is over
        assert carrier.told == []
        assert client.carried_lost(5, ["1"]) is True and client.carried_lost(5, ["1"]) is True
    assert carrier.told == ["rows-stale"]  # once: one replacement is all it takes


def test_carry_function_stamps_rows_with_the_executor_that_shuffles_them(tmp_path: Path) -> None:
    """The stamp is this executor's (found, as a task finds it, through the parent chain), and a
    reducer keeps it (``statuses_by_reducer``)."""
    here = MapOutputService(APP, "9", SECRET, str(tmp_path), jvm_pid=os.getppid())
    try:
        cached = pa.RecordBatch.from_pylist(
            [
                {
                    "rk": 0,
                    "reduce": 0,
                    "map": m,
                    "attempt": "1.2.0",
                    "executor": "1",
                    "host": "h",
                    "data_port": 1,
                    "control_port": 2,
                    "path": "/p",
                    "segments": "[]",
                    "bytes": 0,
                    "batches": 0,
                    "rows": 0,
                    "spill_bytes": 0,
                    "seconds": 0.0,
                }
                for m in range(3)
            ],
            schema=STATUS_SCHEMA,
        )
        [out] = list(carry_function(plan(6, str(tmp_path)), map_stage=1)([cached]))
        assert out.schema.names == [*STATUS_SCHEMA.names, *CARRIER_SCHEMA.names]
        assert set(out.column("carrier").to_pylist()) == {"9"}
        assert set(out.column("map_stage").to_pylist()) == {1}
        assert set(out.column("carrier_port").to_pylist()) == {here.control_address[1]}
        [row, *_] = statuses_by_reducer([out])[0]
        assert (row["executor"], row["carrier"], row["carrier_host"]) == ("1", "9", here.control_address[0])
    finally:
        here.close()


def _status(reduce: int, map_index: int, path: str, attempt: str = "1.2.0") -> dict[str, Any]:
    return {
        "rk": 0,
        "reduce": reduce,
        "map": map_index,
        "attempt": attempt,
        "executor": "1",
        "host": "h",
        "data_port": 1,
        "control_port": 2,
        "path": path,
        "segments": "[]",
        "bytes": 10,
        "batches": 1,
        "rows": 1,
        "spill_bytes": 0,
        "seconds": 0.0,
    }


def test_two_map_outputs_under_one_map_index_fail_the_reducer_naming_both() -> None:
    """Two map partitions evaluated in one task both take its partition id: the reducer must not
    keep one and drop the other's rows (a coalesce below the status exchange did exactly that)."""
    rows = [_status(0, 0, "/s/m0-2.8.0-a.arrows", "2.8.0"), _status(0, 1, "/s/m1-1.2.0-b.arrows")]
    rows.append(_status(0, 0, "/s/m0-2.8.0-c.arrows", "2.8.0"))
    batch = pa.RecordBatch.from_pylist(rows, schema=STATUS_SCHEMA)
    with pytest.raises(ShuffleError, match=r"two map outputs claim map partition 0 .*m0-2.8.0-a.*m0-2.8.0-c"):
        statuses_by_reducer([batch])
    same = pa.RecordBatch.from_pylist([rows[0], rows[1], rows[0]], schema=STATUS_SCHEMA)
    assert [s["map"] for s in statuses_by_reducer([same])[0]] == [0, 1]  # one output, seen twice


def test_outputs_of_a_later_stage_are_recomputed_even_when_every_row_is() -> None:
    """Uncarried rows: the earliest stage among them is the map job's. Carried rows name it: when
    owner and carrier were both replaced, every row a reducer gets is a recomputation's, and the
    earliest of them is not the map job's stage."""
    first, again = _status(0, 0, "/s/a", "1.2.0"), _status(0, 1, "/s/b", "5.9.0")
    assert recomputed_outputs([first, again]) == [(1, "5.9.0")]
    all_again = [_status(0, 0, "/s/c", "5.8.0"), _status(0, 1, "/s/d", "5.9.0")]
    assert recomputed_outputs(all_again) == []  # nothing tells them apart unstamped
    carried = [{**s, "map_stage": 1} for s in all_again]
    assert recomputed_outputs(carried) == [(0, "5.8.0"), (1, "5.9.0")]
    assert recomputed_outputs([{**first, "map_stage": 1}]) == []
