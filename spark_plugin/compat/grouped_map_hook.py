"""The PySpark methods arrowbeat wraps in a user's driver so that ``spark.arrowbeat.shuffle.groupedMap``
takes an application's own grouped-map calls onto arrowbeat's shuffle, with no code change.

Wrapped, in classic (py4j) sessions:

- ``pyspark.sql.classic.dataframe.DataFrame.groupBy`` (and ``groupby`` where it is the same
  function object, pyspark 4.2+; before, ``groupby`` calls ``groupBy``): the arguments are kept on
  the ``GroupedData`` it returns (:data:`GROUPING_ATTR`), since PySpark hands the grouping columns
  to the JVM and keeps none of them. ``rollup``, ``cube``, ``groupingSets`` and ``pivot`` keep
  nothing, so their grouped maps stay Spark's.
- ``PandasGroupedOpsMixin.applyInPandas`` / ``applyInArrow`` and ``PandasCogroupedOps.applyInPandas`` /
  ``applyInArrow``: the key is read from the session's runtime conf at each call (one lookup).
  ``off`` calls Spark's method as it is. ``on``/``auto`` offer the call (:class:`Offer`) to the
  ``takeover`` function, which answers with arrowbeat's DataFrame or the reason it leaves the call
  to Spark (:class:`Decision`); the reason is logged in one line and Spark's method runs.
- the stateful forms (``applyInPandasWithState``, ``transformWithStateInPandas``,
  ``transformWithState``): never taken over; with the key on, one line says so.

In Spark Connect clients (``pyspark.sql.connect.group``), ``applyInPandas``/``applyInArrow`` are
wrapped only to say, with the key on, that Spark's own runs there.

Before wrapping, each method is checked: it exists and its parameters are the recorded ones
(``inspect.signature``). A method that fails the check is not wrapped (one warning naming it and
why): its calls are Spark's. The ``takeover`` function is resolved at the first call with the key
on (``provider``), so nothing of arrowbeat's shuffle (nor pyarrow) is imported before; and
anything it raises other than a ``ConfigError`` (a malformed key) becomes Spark's method plus one
log line. Wrapping is idempotent: a wrapper is never wrapped again.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from spark_plugin.errors import ConfigError
from spark_plugin.settings.config import OPTIONS_BY_KEY, key_of

log = logging.getLogger(__name__)

KEY = key_of("shuffle_grouped_map")
GROUPING_ATTR = "_arrowbeat_grouping"
"""Where the wrapped ``groupBy`` keeps its arguments on the ``GroupedData`` it returns."""
_WRAPPED = "__arrowbeat_wrapped__"
_SEEN = "__arrowbeat_grouped_map_hook__"

GROUP_BY = ("pyspark.sql.classic.dataframe", "DataFrame", "groupBy", ("self", "cols"))
APPLY = ("applyInPandas", "applyInArrow")
TAKEN: tuple[tuple[str, str, str, tuple[str, ...]], ...] = tuple(
    ("pyspark.sql.pandas.group_ops", cls, method, ("self", "func", "schema"))
    for cls in ("PandasGroupedOpsMixin", "PandasCogroupedOps")
    for method in APPLY
)
"""(module, class, method, parameters) of the calls arrowbeat takes over."""
STATEFUL = ("applyInPandasWithState", "transformWithStateInPandas", "transformWithState")
"""Grouped forms never taken over (their state lives in Spark's state store)."""
CONNECT = ("pyspark.sql.connect.group", ("GroupedData", "PandasCogroupedOps"))
MODULES = frozenset({GROUP_BY[0], "pyspark.sql.pandas.group_ops", CONNECT[0]})
"""The modules whose loading installs wrappers (``patch_loaded``)."""


@dataclass(frozen=True)
class Side:
    """One grouped DataFrame of a call: the DataFrame and what ``groupBy`` was called with
    (None when the ``GroupedData`` came from elsewhere: rollup, cube, pivot, ...)."""

    df: Any
    grouping: tuple[Any, ...] | None


@dataclass(frozen=True)
class Offer:
    """A grouped-map call arrowbeat may take: ``applyInPandas``/``applyInArrow`` on one side, or
    on two for a cogroup."""

    method: str
    func: Callable[..., Any]
    schema: Any
    sides: tuple[Side, ...]

    @property
    def cogroup(self) -> bool:
        return len(self.sides) == 2

    def describe(self) -> str:
        """The call as the user wrote it, e.g. ``groupBy(k).applyInPandas(normalize)``."""
        groups = [
            "groupBy(" + (", ".join(map(_shown, s.grouping)) if s.grouping is not None else "?") + ")"
            for s in self.sides
        ]
        name = getattr(self.func, "__name__", type(self.func).__name__)
        return f"{'.cogroup('.join(groups)}{')' if self.cogroup else ''}.{self.method}({name})"


@dataclass(frozen=True)
class Decision:
    """arrowbeat's DataFrame for an :class:`Offer`, or None and why Spark's own method runs."""

    df: Any
    reason: str = ""


Takeover = Callable[[Offer, str], Decision]
"""``takeover(offer, mode)``, ``mode`` being ``on`` or ``auto``."""


def _shown(col: Any) -> str:
    return repr(col) if isinstance(col, str) else str(col)


def mode_of(session: Any) -> str:
    """The key's value as ``session`` sees it now (runtime conf, which includes the application's
    conf); ``ConfigError`` naming the key and the expected form for a malformed one."""
    option = OPTIONS_BY_KEY[KEY]
    value = session.conf.get(KEY, None)
    if value is None or value == "":
        return str(option.parse(option.default))
    try:
        return str(option.parse(str(value)))
    except ValueError:
        raise ConfigError([f"{KEY}={value!r}: expected {option.expected}"]) from None


def _leave_level(session: Any) -> int:
    """How loudly a call left to Spark is logged: WARNING where the application set the key (it
    asked for arrowbeat's shuffle), INFO under the default ``auto`` (every grouped map of every
    application that has the wheel would otherwise warn: small inputs, the plugin not on)."""
    try:
        explicit = session.conf.get(KEY, None) not in (None, "")
    except Exception:  # the conf cannot be read: the quiet level
        explicit = False
    return logging.WARNING if explicit else logging.INFO


# -- checks -------------------------------------------------------------------------------------
def _parameters(function: Any) -> tuple[str, ...] | None:
    try:
        return tuple(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return None


def check(owner: Any, method: str, expected: tuple[str, ...]) -> str:
    """Why ``owner.method`` cannot be wrapped, or ``""``."""
    current = owner.__dict__.get(method) if isinstance(owner, type) else None
    if current is None:
        return f"{getattr(owner, '__name__', owner)}.{method} is not defined there"
    if getattr(current, _WRAPPED, False):
        return ""
    found = _parameters(current)
    if found != expected:
        return f"{owner.__name__}.{method}{found} is not the recorded ({', '.join(expected)})"
    return ""


# -- wrappers -----------------------------------------------------------------------------------
def _mark(wrapper: Callable[..., Any]) -> Callable[..., Any]:
    setattr(wrapper, _WRAPPED, True)
    return wrapper


def _wrap_group_by(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def groupBy(self: Any, *cols: Any) -> Any:
        grouped = original(self, *cols)
        with contextlib.suppress(Exception):  # no __dict__: its grouped maps stay Spark's
            grouped.__dict__[GROUPING_ATTR] = cols
        return grouped

    return _mark(groupBy)


def _sides(grouped: Any) -> tuple[Side, ...] | None:
    """The sides of a ``GroupedData`` (one) or ``PandasCogroupedOps`` (two); None if unreadable."""
    parts = (
        (grouped,)
        if hasattr(grouped, "_df")
        else (getattr(grouped, "_gd1", None), getattr(grouped, "_gd2", None))
    )
    sides = []
    for part in parts:
        df = getattr(part, "_df", None)
        if df is None:
            return None
        sides.append(Side(df, getattr(part, "__dict__", {}).get(GROUPING_ATTR)))
    return tuple(sides)


def _wrap_apply(
    original: Callable[..., Any], method: str, provider: Callable[[], Takeover]
) -> Callable[..., Any]:
    @functools.wraps(original)
    def apply(self: Any, func: Any, schema: Any) -> Any:
        sides = _sides(self)
        if sides is None:
            log.warning("arrowbeat leaves %s to Spark: its grouped DataFrames cannot be read", method)
            return original(self, func, schema)
        mode = mode_of(sides[0].df.sparkSession)
        if mode == "off":
            return original(self, func, schema)
        offer = Offer(method, func, schema, sides)
        try:
            decision = provider()(offer, mode)
        except ConfigError:
            raise
        except Exception as exc:
            decision = Decision(None, f"arrowbeat could not plan it ({type(exc).__name__}: {exc})")
        if decision.df is None:
            log.log(
                _leave_level(sides[0].df.sparkSession),
                "arrowbeat leaves %s to Spark's shuffle (%s=%s): %s",
                offer.describe(),
                KEY,
                mode,
                decision.reason,
            )
            return original(self, func, schema)
        log.info(
            "arrowbeat's shuffle runs %s (%s=%s)%s",
            offer.describe(),
            KEY,
            mode,
            f": {decision.reason}" if decision.reason else "",
        )
        return decision.df

    return _mark(apply)


def _wrap_logged(
    original: Callable[..., Any], what: str, why: str, session_of: Callable[[Any], Any]
) -> Callable[..., Any]:
    """A method arrowbeat never takes over: with the key on, one line says so; Spark's runs."""

    @functools.wraps(original)
    def logged(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            mode = mode_of(session_of(self))
        except ConfigError:
            raise
        except Exception:  # the conf cannot be read: nothing to say
            mode = "off"
        if mode != "off":
            level = _leave_level(session_of(self))
            log.log(level, "arrowbeat leaves %s to Spark's shuffle (%s=%s): %s", what, KEY, mode, why)
        return original(self, *args, **kwargs)

    return _mark(logged)


def _session_of_grouped(grouped: Any) -> Any:
    sides = _sides(grouped)
    if sides is None:
        raise LookupError("no DataFrame")
    return sides[0].df.sparkSession


# -- installing ---------------------------------------------------------------------------------
def _install(owner: type, method: str, wrapper: Callable[..., Any]) -> None:
    setattr(owner, method, wrapper)


def patch_module(module: Any, provider: Callable[[], Takeover]) -> list[str]:
    """Wraps what ``module`` (one of :data:`MODULES`) defines; returns why a method was not wrapped."""
    problems: list[str] = []
    name = getattr(module, "__name__", "")
    if name == GROUP_BY[0]:
        owner = getattr(module, GROUP_BY[1], None)
        problem = (
            check(owner, GROUP_BY[2], GROUP_BY[3]) if isinstance(owner, type) else f"{name} has no DataFrame"
        )
        if problem:
            problems.append(problem)
        elif isinstance(owner, type):
            original = owner.__dict__[GROUP_BY[2]]
            alias = owner.__dict__.get("groupby")
            if not getattr(original, _WRAPPED, False):
                wrapper = _wrap_group_by(original)
                _install(owner, "groupBy", wrapper)
                if alias is original:  # pyspark 4.2+: ``groupby = groupBy``
                    _install(owner, "groupby", wrapper)
    elif name == "pyspark.sql.pandas.group_ops":
        for _, cls, method, expected in TAKEN:
            owner = getattr(module, cls, None)
            problem = check(owner, method, expected) if isinstance(owner, type) else f"{name} has no {cls}"
            if problem:
                problems.append(problem)
            elif isinstance(owner, type) and not getattr(owner.__dict__[method], _WRAPPED, False):
                _install(owner, method, _wrap_apply(owner.__dict__[method], method, provider))
        mixin = getattr(module, "PandasGroupedOpsMixin", None)
        for method in STATEFUL:
            current = mixin.__dict__.get(method) if isinstance(mixin, type) else None
            if callable(current) and not getattr(current, _WRAPPED, False):
                why = "a stateful grouped form: its state lives in Spark's state store"
                _install(mixin, method, _wrap_logged(current, method, why, _session_of_grouped))  # type: ignore[arg-type]
    elif name == CONNECT[0]:
        for cls in CONNECT[1]:
            owner = getattr(module, cls, None)
            for method in APPLY:
                current = owner.__dict__.get(method) if isinstance(owner, type) else None
                if callable(current) and not getattr(current, _WRAPPED, False):
                    why = "a Spark Connect client: arrowbeat takes over grouped maps of classic sessions only"
                    _install(owner, method, _wrap_logged(current, f"{cls}.{method}", why, _connect_session))  # type: ignore[arg-type]
    return problems


def _connect_session(grouped: Any) -> Any:
    gd = getattr(grouped, "_gd1", grouped)
    return gd._df.sparkSession


def patch_loaded(provider: Callable[[], Takeover]) -> bool:
    """Wraps the methods of every module of :data:`MODULES` loaded so far and not yet seen (the
    import hook calls it as each loads); False when a method had to be left unwrapped. One warning
    per such method, once per process."""
    ok = True
    for name in sorted(MODULES):
        module = sys.modules.get(name)
        if module is None or getattr(module, _SEEN, False):
            continue
        setattr(module, _SEEN, True)
        for problem in patch_module(module, provider):
            ok = False
            log.warning(
                "arrowbeat does not wrap a PySpark method for %s: %s; those calls run Spark's own",
                KEY,
                problem,
            )
    return ok


def is_wrapped(function: Any) -> bool:
    """Whether ``function`` is one of this module's wrappers (what a test checks)."""
    return bool(getattr(function, _WRAPPED, False))


# -- what a call's arguments mean -----------------------------------------------------------------
UNRESOLVED_ATTRIBUTE = "org.apache.spark.sql.internal.UnresolvedAttribute"
"""The JVM column node of ``F.col("k")``, ``df.k`` and ``df["k"]`` in every supported Spark (4.0+)."""


EXPRESSION_NODE = "org.apache.spark.sql.classic.ExpressionColumnNode"
"""The node of ``df.k`` / ``df["k"]``: the column resolved against ``df``, a Catalyst expression."""
ATTRIBUTE_REFERENCE = "org.apache.spark.sql.catalyst.expressions.AttributeReference"


def column_name(col: Any) -> str | None:
    """The column name a classic ``Column`` refers to (``F.col("k")``, ``df.k``, ``df["k"]``), or
    None for anything else: an expression, a nested field, a metadata column, an unreadable node."""
    try:
        node = col._jc.node()
        kind = str(node.getClass().getName())
        if kind == EXPRESSION_NODE:
            expression = node.expression()
            if str(expression.getClass().getName()) != ATTRIBUTE_REFERENCE:
                return None
            return str(expression.name())
        if kind != UNRESOLVED_ATTRIBUTE or bool(node.isMetadataColumn()):
            return None
        parts = node.nameParts()
        if int(parts.size()) != 1:
            return None
        return str(parts.apply(0))
    except Exception:
        return None


def iterator_forms() -> bool:
    """Whether this PySpark's ``applyInPandas``/``applyInArrow`` read type hints for the iterator
    form (4.1+): on 4.0 a function hinted so gets the whole group, and arrowbeat must not differ."""
    try:
        from pyspark.sql.pandas import typehints
    except Exception:
        return False
    return all(
        callable(getattr(typehints, name, None))
        for name in ("infer_group_pandas_eval_type_from_func", "infer_group_arrow_eval_type_from_func")
    )
