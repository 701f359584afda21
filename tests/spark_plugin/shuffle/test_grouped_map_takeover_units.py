"""``spark.arrowbeat.shuffle.groupedMap`` without Spark: what the hook wraps and how a wrapped call
decides (conf read at call time, ``off`` is Spark's method, every refusal one log line and Spark's
method, a malformed key a ``ConfigError``), how ``groupBy``'s arguments become column names, and
the start-up watcher installing the hook when PySpark loads (a fresh interpreter, no JVM).

PySpark's classes are stood in for by fakes with the recorded signatures (fresh per test, so
wrapping one never touches the real PySpark of the test process)."""

from __future__ import annotations

import logging
import subprocess
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import _arrowbeat_startup
from spark_plugin.compat import grouped_map_hook as hook
from spark_plugin.compat.grouped_map_hook import Decision, Offer, Side
from spark_plugin.compat.plan_stats import PlanSize
from spark_plugin.errors import ConfigError
from spark_plugin.shuffle.driver import grouped, shuffle_settings, takeover
from spark_plugin.shuffle.driver.route import Route
from spark_plugin.shuffle.driver.takeover import grouping_names, take_over

ROOT = Path(__file__).resolve().parents[3]


class FakeConf:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values
        self.reads = 0

    def get(self, key: str, default: Any = None) -> Any:
        self.reads += 1
        return self.values.get(key, default)


class FakeSession:
    def __init__(self, **values: str) -> None:
        self.conf = FakeConf(values)


class FakeFrame:
    def __init__(self, session: FakeSession, columns: list[str]) -> None:
        self.sparkSession = session
        self.columns = columns


def fake_pyspark(session: FakeSession, columns: list[str]) -> dict[str, types.ModuleType]:
    """Modules with the classes and methods the hook wraps, as PySpark 4.2 defines them."""
    calls: list[str] = []

    class GroupedData:
        def __init__(self, df: Any) -> None:
            self._df = df
            self.session = df.sparkSession

    class PandasGroupedOpsMixin:
        def applyInPandas(self, func: Any, schema: Any) -> str:
            calls.append("spark applyInPandas")
            return "spark's"

        def applyInArrow(self, func: Any, schema: Any) -> str:
            calls.append("spark applyInArrow")
            return "spark's"

        def applyInPandasWithState(self, func: Any, *rest: Any) -> str:
            calls.append("spark applyInPandasWithState")
            return "spark's"

        def cogroup(self, other: Any) -> Any:
            return PandasCogroupedOps(self, other)

    class Grouped(GroupedData, PandasGroupedOpsMixin):
        pass

    class PandasCogroupedOps:
        def __init__(self, gd1: Any, gd2: Any) -> None:
            self._gd1 = gd1
            self._gd2 = gd2

        def applyInPandas(self, func: Any, schema: Any) -> str:
            calls.append("spark cogroup applyInPandas")
            return "spark's"

        def applyInArrow(self, func: Any, schema: Any) -> str:
            calls.append("spark cogroup applyInArrow")
            return "spark's"

    class DataFrame(FakeFrame):
        def groupBy(self, *cols: Any) -> Grouped:
            return Grouped(self)

        groupby = groupBy

        def cube(self, *cols: Any) -> Grouped:
            return Grouped(self)

    frames = types.ModuleType(hook.GROUP_BY[0])
    frames.DataFrame = DataFrame  # type: ignore[attr-defined]
    ops = types.ModuleType("pyspark.sql.pandas.group_ops")
    ops.PandasGroupedOpsMixin = PandasGroupedOpsMixin  # type: ignore[attr-defined]
    ops.PandasCogroupedOps = PandasCogroupedOps  # type: ignore[attr-defined]
    ops.calls = calls  # type: ignore[attr-defined]
    ops.make = lambda: DataFrame(session, columns)  # type: ignore[attr-defined]
    return {"frames": frames, "ops": ops}


class Provider:
    """The takeover function, recording its offers and answering ``answer``."""

    def __init__(self, answer: Callable[[Offer, str], Decision]) -> None:
        self.answer = answer
        self.offers: list[tuple[Offer, str]] = []
        self.resolved = 0

    def __call__(self) -> Callable[[Offer, str], Decision]:
        self.resolved += 1

        def takeover(offer: Offer, mode: str) -> Decision:
            self.offers.append((offer, mode))
            return self.answer(offer, mode)

        return takeover


def installed(
    session: FakeSession, answer: Callable[[Offer, str], Decision], columns: list[str] | None = None
) -> tuple[dict[str, types.ModuleType], Provider]:
    mods = fake_pyspark(session, columns or ["k", "v"])
    provider = Provider(answer)
    for module in mods.values():
        assert hook.patch_module(module, provider) == []
    return mods, provider


def ours(offer: Offer, mode: str) -> Decision:
    return Decision("arrowbeat's")


def normalize(pdf: Any) -> Any:
    return pdf


def test_off_is_sparks_method_after_one_conf_read_and_imports_nothing() -> None:
    session = FakeSession(**{hook.KEY: "off"})
    mods, provider = installed(session, ours)
    df = mods["ops"].make()
    assert df.groupBy("k").applyInPandas(normalize, "k long") == "spark's"
    assert session.conf.reads == 1 and provider.resolved == 0
    assert mods["ops"].calls == ["spark applyInPandas"]


@pytest.mark.parametrize("mode", ["on", "auto", " ON "])
def test_on_and_auto_hand_the_call_to_arrowbeat(mode: str) -> None:
    session = FakeSession(**{hook.KEY: mode})
    mods, provider = installed(session, ours)
    df = mods["ops"].make()
    assert df.groupby(["k"]).applyInArrow(normalize, "k long") == "arrowbeat's"
    ((offer, seen),) = provider.offers
    assert seen == mode.strip().lower() and offer.method == "applyInArrow" and not offer.cogroup
    assert offer.sides[0].grouping == (["k"],) and offer.func is normalize
    assert mods["ops"].calls == []


def test_cogroup_offers_both_sides() -> None:
    session = FakeSession(**{hook.KEY: "on"})
    mods, provider = installed(session, ours)
    left, right = mods["ops"].make(), mods["ops"].make()
    out = left.groupBy("k").cogroup(right.groupBy("v")).applyInPandas(normalize, "k long")
    assert out == "arrowbeat's"
    ((offer, _),) = provider.offers
    assert offer.cogroup and [s.grouping for s in offer.sides] == [("k",), ("v",)]
    assert offer.describe() == "groupBy('k').cogroup(groupBy('v')).applyInPandas(normalize)"


def test_a_refusal_is_one_log_line_and_sparks_method(caplog: pytest.LogCaptureFixture) -> None:
    session = FakeSession(**{hook.KEY: "on"})
    mods, _ = installed(session, lambda offer, mode: Decision(None, "grouping by an expression"))
    with caplog.at_level(logging.INFO, logger=hook.__name__):
        assert mods["ops"].make().groupBy("k").applyInPandas(normalize, "k long") == "spark's"
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert "groupBy('k').applyInPandas(normalize)" in record.message
    assert "grouping by an expression" in record.message and hook.KEY in record.message


def test_the_default_is_auto_and_what_it_leaves_to_spark_is_logged_at_info(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Unset, the key is ``auto``: the call is offered; a call left to Spark says why at INFO (the
    application did not ask), where a key the application set says it at WARNING."""
    session = FakeSession()
    mods, provider = installed(session, ours)
    assert mods["ops"].make().groupBy("k").applyInPandas(normalize, "k long") == "arrowbeat's"
    assert [mode for _, mode in provider.offers] == ["auto"]
    mods, _ = installed(session, lambda offer, mode: Decision(None, "a small input"))
    with caplog.at_level(logging.INFO, logger=hook.__name__):
        assert mods["ops"].make().groupBy("k").applyInPandas(normalize, "k long") == "spark's"
        session.conf.values[hook.KEY] = "auto"
        assert mods["ops"].make().groupBy("k").applyInPandas(normalize, "k long") == "spark's"
    assert [r.levelno for r in caplog.records] == [logging.INFO, logging.WARNING]
    assert all("a small input" in r.message for r in caplog.records)


def test_a_failing_takeover_is_sparks_method_never_an_error(caplog: pytest.LogCaptureFixture) -> None:
    def broken(offer: Offer, mode: str) -> Decision:
        raise RuntimeError("agents unreachable")

    session = FakeSession(**{hook.KEY: "auto"})
    mods, _ = installed(session, broken)
    with caplog.at_level(logging.WARNING, logger=hook.__name__):
        assert mods["ops"].make().groupBy("k").applyInArrow(normalize, "k long") == "spark's"
    (record,) = caplog.records
    assert "RuntimeError: agents unreachable" in record.message


def test_a_malformed_key_names_the_key_and_the_expected_form() -> None:
    session = FakeSession(**{hook.KEY: "yes"})
    mods, _ = installed(session, ours)
    with pytest.raises(ConfigError) as caught:
        mods["ops"].make().groupBy("k").applyInPandas(normalize, "k long")
    assert f"{hook.KEY}='yes': expected off, on or auto" in str(caught.value)


def test_stateful_forms_stay_sparks_with_one_line_when_on(caplog: pytest.LogCaptureFixture) -> None:
    session = FakeSession(**{hook.KEY: "on"})
    mods, provider = installed(session, ours)
    with caplog.at_level(logging.INFO, logger=hook.__name__):
        assert (
            mods["ops"].make().groupBy("k").applyInPandasWithState(normalize, "a", "b", "c", "d") == "spark's"
        )
    (record,) = caplog.records
    assert "applyInPandasWithState" in record.message and "state store" in record.message
    assert provider.offers == []
    session.conf.values[hook.KEY] = "off"
    caplog.clear()
    mods["ops"].make().groupBy("k").applyInPandasWithState(normalize, "a", "b", "c", "d")
    assert caplog.records == []


def test_a_method_whose_signature_changed_is_left_unwrapped() -> None:
    mods = fake_pyspark(FakeSession(), ["k"])
    mixin = mods["ops"].PandasGroupedOpsMixin

    def applyInPandas(self: Any, func: Any, schema: Any, extra: Any) -> str:
        return "spark's"

    mixin.applyInPandas = applyInPandas
    problems = hook.patch_module(mods["ops"], Provider(ours))
    assert problems == [
        "PandasGroupedOpsMixin.applyInPandas('self', 'func', 'schema', 'extra') "
        "is not the recorded (self, func, schema)"
    ]
    assert mixin.applyInPandas is applyInPandas and hook.is_wrapped(mixin.applyInArrow)


def test_wrapping_twice_wraps_once() -> None:
    mods, provider = installed(FakeSession(**{hook.KEY: "on"}), ours)
    frame_class = mods["frames"].DataFrame
    first = frame_class.groupBy
    assert hook.patch_module(mods["frames"], provider) == [] and frame_class.groupBy is first
    assert frame_class.groupby is first  # 4.2+'s alias follows groupBy


def test_rollup_cube_and_pivot_keep_no_grouping() -> None:
    mods, provider = installed(FakeSession(**{hook.KEY: "on"}), ours)
    mods["ops"].make().cube("k").applyInPandas(normalize, "k long")
    assert provider.offers[0][0].sides[0].grouping is None


@pytest.mark.parametrize(
    ("grouping", "expected"),
    [
        (("k",), ("k",)),
        ((["k", "v"],), ("k", "v")),
        ((2, "k"), ("v", "k")),
        (("K",), ("k",)),
        (("x",), "'x' is not exactly one top-level column of the DataFrame"),
        ((0,), "the ordinal 0 is not a column"),
        ((True,), "groupBy(True) is not a column"),
        ((), "groupBy() without grouping columns"),
        ((object(),), "grouping by an expression"),
        (None, "the grouping is not a DataFrame.groupBy(...)"),
    ],
)
def test_grouping_names(grouping: tuple[Any, ...] | None, expected: tuple[str, ...] | str) -> None:
    got = grouping_names(Side(FakeFrame(FakeSession(), ["k", "v"]), grouping), case_sensitive=False)
    if isinstance(expected, tuple):
        assert got == expected
    else:
        assert isinstance(got, str) and got.startswith(expected), got


def test_grouping_names_follow_case_sensitivity_and_refuse_ambiguity() -> None:
    side = Side(FakeFrame(FakeSession(), ["k", "K", "v"]), ("k",))
    assert grouping_names(side, case_sensitive=True) == ("k",)
    assert isinstance(grouping_names(Side(side.df, ("V",)), case_sensitive=True), str)
    assert grouping_names(Side(side.df, ("V",)), case_sensitive=False) == ("v",)
    assert isinstance(grouping_names(Side(FakeFrame(FakeSession(), ["k", "k"]), ("k",)), False), str)


def test_take_over_refuses_a_connect_session() -> None:
    class ConnectLike:  # no _jsc, no sparkContext: what compat.connect calls a Connect session
        conf = FakeConf({})

    offer = Offer("applyInPandas", normalize, "k long", (Side(FakeFrame(ConnectLike(), ["k"]), ("k",)),))  # type: ignore[arg-type]
    decision = take_over(offer, "on")
    assert decision.df is None and "Spark Connect" in decision.reason


def test_the_watcher_watches_what_the_hook_wraps() -> None:
    assert _arrowbeat_startup.WATCHED == hook.MODULES


WATCH = """
import sys, _arrowbeat_startup
_arrowbeat_startup.watch()
assert not any(m.startswith("spark_plugin") for m in sys.modules), "the watcher imported arrowbeat"
import pyspark.sql
from pyspark.sql.classic.dataframe import DataFrame
from pyspark.sql.pandas.group_ops import PandasGroupedOpsMixin, PandasCogroupedOps
from spark_plugin.compat.grouped_map_hook import is_wrapped
print(is_wrapped(DataFrame.groupBy), is_wrapped(PandasGroupedOpsMixin.applyInPandas),
      is_wrapped(PandasCogroupedOps.applyInArrow),
      any(m.startswith(("pyarrow", "spark_plugin.shuffle")) for m in sys.modules))
"""


@pytest.mark.parametrize(
    ("switch", "expected"), [("1", "True True True False"), ("0", "False False False False")]
)
def test_the_watcher_wraps_pyspark_as_it_loads(switch: str, expected: str) -> None:
    """A fresh interpreter: nothing of arrowbeat imported by the watcher itself; PySpark's methods
    wrapped as its modules load, without loading the shuffle (or pyarrow); the switch turns it off."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), _arrowbeat_startup.SWITCH: switch}
    done = subprocess.run([sys.executable, "-c", WATCH], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == expected.split()


class _Planned(Exception):
    """Raised by the stand-in for the shuffle's planning, with the size it was handed."""

    def __init__(self, size: PlanSize | None) -> None:
        super().__init__("planned")
        self.size = size


def _plan_with(monkeypatch: pytest.MonkeyPatch) -> None:
    """A classic-looking session whose arrowbeat settings are valid; planning stops at
    ``_partitions`` with the size it was given (``None``: it would read the statistics itself)."""

    def partitions(*_args: Any, size: PlanSize | None = None, **_kwargs: Any) -> Any:
        raise _Planned(size)

    monkeypatch.setattr(takeover, "is_connect", lambda _spark: False)
    monkeypatch.setattr(shuffle_settings, "shuffle_settings", lambda _spark: None)
    monkeypatch.setattr(grouped, "_partitions", partitions)


def _cogrouped(key: Any, left: Any, right: Any) -> Any:
    return left


@pytest.mark.parametrize("cogroup", [False, True], ids=["group", "cogroup"])
def test_auto_plans_the_shuffle_from_the_statistics_its_route_read(
    monkeypatch: pytest.MonkeyPatch, cogroup: bool
) -> None:
    """``groupedMap=auto`` reads the input's statistics to route the call; the shuffle it takes
    is planned from those, not from a second read (4-8 ms per call); ``on`` routes nothing and
    planning reads them itself."""
    _plan_with(monkeypatch)
    session = FakeSession()
    sides = tuple(Side(FakeFrame(session, ["k", "v"]), ("k",)) for _ in range(2 if cogroup else 1))
    func = _cogrouped if cogroup else normalize
    offer = Offer("applyInPandas", func, "k long, v long", sides)
    size = PlanSize(123_456_789, rows=1_000_000)
    routes: list[tuple[Any, Any]] = []

    def route(df: Any, other: Any) -> Route:
        routes.append((df, other))
        return Route(
            "arrowbeat", "input 123456789 bytes >= 2097152", size.bytes, "group", 2_097_152, 0.004, size
        )

    with pytest.raises(_Planned) as planned:
        take_over(offer, "auto", route)
    assert planned.value.size is size
    assert routes == [(sides[0].df, sides[1].df if cogroup else None)]
    with pytest.raises(_Planned) as planned:
        take_over(offer, "on", route)
    assert planned.value.size is None and len(routes) == 1
