"""The exchange decision (``spark_plugin.shuffle.driver.route``) given statistics, and the forcing keys,
without Spark: fake sessions answer the conf, a fake DataFrame answers the statistics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from arrow_shuffle.errors import ShuffleConfigError
from spark_plugin.compat.plan_stats import PlanSize, growing_operator, plan_size
from spark_plugin.errors import ConfigError
from spark_plugin.history.shuffle_metrics import rows_of
from spark_plugin.history.tables import DEFAULT_RETENTION_S, SHUFFLE_METRICS
from spark_plugin.shuffle.driver import metrics_sink
from spark_plugin.shuffle.driver import route as route_module
from spark_plugin.shuffle.driver.route import (
    SPARK_BELOW,
    Crossover,
    Route,
    choose,
    decide,
    report,
    resolve_path,
)

KEY = "spark.arrowbeat.shuffle.path"
LIMITS = {"group": Crossover(default=100, explicit=50), "partition": Crossover(default=1000, explicit=500)}


class _RuntimeConf:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)


class _SparkConf:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def getAll(self) -> list[tuple[str, str]]:
        return list(self.values.items())

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)


class _CopiedConf(_SparkConf):
    """``SparkContext.getConf()``: a copy of the whole conf, one py4j round trip per entry."""

    copies = 0

    def __init__(self, values: dict[str, str]) -> None:
        super().__init__(values)
        _CopiedConf.copies += 1


class _Context:
    def __init__(self, values: dict[str, str]) -> None:
        self._conf = _SparkConf(values)

    def getConf(self) -> _SparkConf:
        return _CopiedConf(self._conf.values)


class FakeSession:
    """A classic session's conf surface: the application's ``SparkConf`` and the runtime conf."""

    def __init__(self, app: dict[str, str] | None = None, runtime: dict[str, str] | None = None) -> None:
        self._jsc = object()
        self.sparkContext = _Context(app or {})
        self.conf = _RuntimeConf(runtime or {})


class _JavaStats:
    def __init__(self, size: int) -> None:
        self.size = size

    def sizeInBytes(self) -> int:
        return self.size

    def rowCount(self) -> Any:
        class _Nothing:
            def isDefined(self) -> bool:
                return False

        return _Nothing()


class FakeFrame:
    """A DataFrame whose optimized plan reports ``size`` bytes (None: reading it fails)."""

    def __init__(self, size: int | None, session: Any = None) -> None:
        self.size = size
        self.sparkSession = session or FakeSession()

    def select(self, *cols: str) -> FakeFrame:
        return self

    @property
    def _jdf(self) -> Any:
        frame = self

        class _Plan:
            def stats(self) -> _JavaStats:
                if frame.size is None:
                    raise RuntimeError("no such method")
                return _JavaStats(frame.size)

        class _Execution:
            def optimizedPlan(self) -> _Plan:
                return _Plan()

        class _Jdf:
            def queryExecution(self) -> _Execution:
                return _Execution()

        return _Jdf()


def frame(size: int | None, session: Any = None) -> Any:
    """A ``FakeFrame`` typed as the DataFrame it stands in for."""
    return FakeFrame(size, session)


@pytest.mark.parametrize(
    ("op", "size", "explicit", "path"),
    [
        ("group", 99, False, "spark"),
        ("group", 100, False, "arrowbeat"),
        ("group", 49, True, "spark"),
        ("group", 50, True, "arrowbeat"),
        ("group", 0, False, "spark"),
        ("partition", 999, False, "spark"),
        ("partition", 1000, False, "arrowbeat"),
        ("partition", 600, True, "arrowbeat"),
    ],
)
def test_auto_takes_sparks_path_below_the_crossover_only(
    op: str, size: int, explicit: bool, path: str
) -> None:
    route = decide(op, PlanSize(size), "auto", explicit, LIMITS)
    assert route.path == path
    assert route.estimated_bytes == size
    assert route.threshold_bytes == LIMITS[op].below(explicit)
    assert f"{size:,} bytes" in route.reason


def test_without_statistics_auto_keeps_arrowbeats_path_and_says_so() -> None:
    route = decide("group", PlanSize(None, why_not="a Spark Connect session"), "auto", False, LIMITS)
    assert (route.path, route.estimated_bytes) == ("arrowbeat", None)
    assert route.reason.startswith("no statistics") and "Spark Connect" in route.reason


@pytest.mark.parametrize("forced", ["arrowbeat", "spark"])
@pytest.mark.parametrize("size", [0, 10**12, None])
def test_a_forced_path_is_taken_whatever_the_size(forced: str, size: int | None) -> None:
    route = decide("partition", PlanSize(size), forced, False, LIMITS)
    assert route.path == forced and route.reason == f"forced: path={forced}"
    assert route.threshold_bytes is None


def test_unknown_paths_and_ops_are_refused() -> None:
    with pytest.raises(ShuffleConfigError, match="path='fast'"):
        decide("group", PlanSize(1), "fast")
    with pytest.raises(ShuffleConfigError, match="op='join'"):
        decide("join", PlanSize(1), "auto")
    with pytest.raises(ShuffleConfigError, match="path='fast'"):
        resolve_path(FakeSession(), "fast")


def test_the_measured_thresholds_are_the_defaults() -> None:
    assert set(SPARK_BELOW) == {"group", "partition"}
    for crossover in SPARK_BELOW.values():
        assert crossover.default > 0 and crossover.explicit >= 0
    assert decide("group", PlanSize(0), "auto").path == "spark"
    assert decide("group", PlanSize(10**13), "auto").path == "arrowbeat"
    # A count of 0: arrowbeat's path won every measured cell, so auto never leaves it.
    assert decide("group", PlanSize(0), "auto", explicit_partitions=True).path == "arrowbeat"


def test_argument_beats_runtime_conf_beats_application_conf_beats_unset() -> None:
    both = FakeSession({KEY: "spark"}, {KEY: "arrowbeat"})
    assert resolve_path(both, "auto") == ("auto", True)
    assert resolve_path(both, None) == ("arrowbeat", True)
    assert resolve_path(FakeSession({KEY: "spark"}), None) == ("spark", True)
    assert resolve_path(FakeSession(), None) == ("arrowbeat", False)
    assert resolve_path(FakeSession(), None, unset="auto") == ("auto", False)


def test_the_key_is_read_from_the_live_conf_without_copying_it() -> None:
    before = _CopiedConf.copies
    assert resolve_path(FakeSession({KEY: "spark", "spark.other": "x"}), None) == ("spark", True)
    assert resolve_path(FakeSession(), None) == ("arrowbeat", False)
    assert _CopiedConf.copies == before


def test_a_malformed_key_is_the_plugins_config_error_naming_it() -> None:
    with pytest.raises(ConfigError, match=KEY):
        resolve_path(FakeSession({KEY: "fastest"}), None)


def test_choose_reads_the_plan_and_sums_a_cogroups_two_inputs() -> None:
    small = frame(10)
    assert choose(small, "group", "auto").path == "spark"
    big = frame(SPARK_BELOW["group"].default)
    assert choose(big, "group", "auto").path == "arrowbeat"
    half = SPARK_BELOW["group"].default // 2 + 1
    route = choose(frame(half), "group", "auto", other=frame(half))
    assert (route.path, route.estimated_bytes) == ("arrowbeat", 2 * half)
    assert choose(frame(None), "group", "auto", other=frame(5)).path == "arrowbeat"


def test_the_key_forces_choose_and_unset_decides_as_the_caller_says() -> None:
    tiny = frame(1, FakeSession({KEY: "arrowbeat"}))
    assert choose(tiny, "group").path == "arrowbeat"
    assert choose(frame(1), "group").path == "spark"  # unset: auto (the groupedMap hook's default)
    huge = frame(10**13, FakeSession(runtime={KEY: "spark"}))
    assert choose(huge, "partition").reason == "forced: path=spark"


def test_unreadable_statistics_fall_back_with_the_reason() -> None:
    size = plan_size(frame(None))
    assert size.bytes is None and "not readable" in size.why_not

    class ConnectLike:  # no _jsc, no sparkContext: what a Spark Connect session lacks
        conf = _RuntimeConf({})

    remote = frame(5, ConnectLike())
    assert plan_size(remote).bytes is None
    assert "Spark Connect" in plan_size(remote).why_not


def test_choose_keeps_the_statistics_it_read_for_planning_the_shuffle() -> None:
    route = choose(frame(12345), "group", "auto")
    assert route.size is not None and route.size.bytes == 12345
    assert route.size.grows == "unknown"  # the fake plan has no text: the estimate may be low


@pytest.mark.parametrize(
    ("text", "grows"),
    [
        ("Project [k#1, x#2]\n+- InMemoryRelation [k#1, x#2], StorageLevel(memory)", ""),
        ("Project [k#1]\n+- Generate explode(sequence(0, 9)), false, [id#3]\n   +- Range (0, 3)", "Generate"),
        ("Project [a#1]\n+- Join Inner, (id#1 = id#2)\n   :- MapInArrow summarize(x#3), [a#1]", "MapInArrow"),
        ("FlatMapGroupsInPandas [k#1], f(k#1, x#2), [k#5]\n+- Range (0, 3)", "FlatMapGroupsInPandas"),
        ("Filter (k#1 = Generate)\n+- Range (0, 3)", ""),  # a name inside an expression is no operator
    ],
)
def test_an_operator_that_may_multiply_rows_is_named(text: str, grows: str) -> None:
    assert growing_operator(text) == grows


def test_a_route_is_a_shuffle_metrics_row_with_path_and_reason() -> None:
    route = Route("spark", "input 10 bytes < 100: Spark's exchange measured faster", 10, "group", 100, 0.01)
    rows = rows_of("app-1", 7, [report(route)]).to_pylist()
    assert len(rows) == 1
    row = rows[0]
    assert (row["side"], row["bytes"], row["executor_id"]) == ("route", 10, "driver")
    assert json.loads(row["detail"]) == {
        "route": {"path": "spark", "reason": route.reason, "op": "group", "threshold_bytes": 100}
    }
    unknown = rows_of("app-1", 7, [report(Route("arrowbeat", "no statistics (x)", None))]).to_pylist()
    assert unknown[0]["bytes"] == -1


def _queued(tables: Path, shuffle_id: int) -> metrics_sink.Pending:
    route = Route("spark", "input 10 bytes < 100: Spark's exchange measured faster", 10, "group", 100, 0.01)
    to = metrics_sink.Destination(tables, DEFAULT_RETENTION_S)
    return metrics_sink.Pending(to, "app-route-rows", shuffle_id, [report(route)])


def _shuffle_ids(tables: Path) -> list[int]:
    rows = DeltaTable(str(tables / SHUFFLE_METRICS.name)).to_pyarrow_table().to_pylist()
    return sorted(row["shuffle_id"] for row in rows)


def test_route_rows_wait_while_their_table_is_unwritable_and_are_written_once_it_is_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 24's leftover: rows of calls routed to Spark while the tables cannot be written were
    dropped; they are kept and written, once each, by the first flush that can write them."""
    monkeypatch.setattr(metrics_sink, "_pending", [])
    monkeypatch.setattr(metrics_sink, "_failing", set())
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the tables' parent folder should be")
    tables = blocker / "tables"
    with metrics_sink._pending_lock:
        metrics_sink._pending.extend(_queued(tables, n) for n in (1, 2))
    assert route_module.flush_routes() == 0
    assert [p.shuffle_id for p in metrics_sink._pending] == [1, 2]  # kept, in order
    with metrics_sink._pending_lock:
        metrics_sink._pending.append(_queued(tables, 3))
    assert route_module.flush_routes() == 0  # still failing: nothing lost, nothing doubled
    assert [p.shuffle_id for p in metrics_sink._pending] == [1, 2, 3]
    blocker.unlink()
    blocker.mkdir()
    assert route_module.flush_routes() == 3
    assert metrics_sink._pending == []
    assert _shuffle_ids(tables) == [1, 2, 3]
    assert route_module.flush_routes() == 0
    assert _shuffle_ids(tables) == [1, 2, 3]


def test_unwritable_route_rows_are_bounded_oldest_dropped_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(metrics_sink, "_pending", [])
    monkeypatch.setattr(metrics_sink, "_failing", set())
    monkeypatch.setattr(metrics_sink, "MAX_PENDING", 3)
    monkeypatch.setattr(metrics_sink, "dropped", 0)
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    with metrics_sink._pending_lock:
        metrics_sink._pending.extend(_queued(blocker / "tables", n) for n in range(5))
    assert route_module.flush_routes() == 0
    assert [p.shuffle_id for p in metrics_sink._pending] == [2, 3, 4]
    assert metrics_sink.dropped == 2
