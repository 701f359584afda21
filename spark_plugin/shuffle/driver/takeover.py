"""Whether arrowbeat takes an application's own grouped-map call, and if so its DataFrame.

``spark.arrowbeat.shuffle.groupedMap=on|auto`` has PySpark's ``applyInPandas``/``applyInArrow``
(grouped and cogrouped) offer each call here (``compat.grouped_map_hook``, which owns the PySpark
side). :func:`take_over` answers with ``group_by(df, *names).applyIn...(func, schema)`` (the
same function on arrowbeat's shuffle, ``grouped``) or with the reason Spark's own method runs:

- the grouping is not plain columns of the DataFrame (an expression, a nested field, rollup, cube,
  pivot, a column of another DataFrame: what ``group_by`` cannot name);
- arrowbeat is not on in the application (no agents to shuffle to) or the session is a Spark
  Connect client;
- the function has a shape it cannot read (``grouped_map.form_of`` refuses it), or the iterator
  form on a PySpark that has none (4.0: Spark passes the whole group);
- ``auto`` and the input is one Spark's exchange handles faster (``route.choose``: by the
  optimizer's size of the input, or forced by ``spark.arrowbeat.shuffle.path``); the choice is a
  ``shuffle_metrics`` row either way (``route``);
- planning failed (the message says how).

Every reason is one log line (the hook writes it) and never an error: the call then is Spark's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from arrow_shuffle.errors import ShuffleConfigError
from spark_plugin.compat.connect import is_connect
from spark_plugin.compat.grouped_map_hook import Decision, Offer, Side, column_name, iterator_forms
from spark_plugin.errors import ConfigError

API = {"applyInPandas": "pandas", "applyInArrow": "arrow"}


def grouping_names(side: Side, case_sensitive: bool) -> tuple[str, ...] | str:
    """The column names ``side``'s ``groupBy`` arguments name in its DataFrame, or why not.

    Spark's forms: names, ordinals (1-based), columns, or one list of them; a name matches as
    Spark resolves it (case-insensitively unless ``spark.sql.caseSensitive``)."""
    if side.grouping is None:
        return "the grouping is not a DataFrame.groupBy(...) (rollup, cube, pivot or grouping sets)"
    cols: Sequence[Any] = side.grouping
    if len(cols) == 1 and isinstance(cols[0], list | tuple):
        cols = cols[0]
    if not cols:
        return "groupBy() without grouping columns"
    columns = list(side.df.columns)
    names: list[str] = []
    for col in cols:
        if isinstance(col, bool):
            return f"groupBy({col!r}) is not a column"
        if isinstance(col, int):
            if not 1 <= col <= len(columns):
                return f"the ordinal {col} is not a column"
            name: str | None = columns[col - 1]
        elif isinstance(col, str):
            name = col
        else:
            name = column_name(col)
            if name is None:
                return f"grouping by an expression ({col}), not a column name"
        resolved = _resolve(name, columns, case_sensitive)
        if resolved is None:
            return f"{name!r} is not exactly one top-level column of the DataFrame"
        names.append(resolved)
    return tuple(names)


def _resolve(name: str | None, columns: list[str], case_sensitive: bool) -> str | None:
    if name is None:
        return None
    exact = [c for c in columns if c == name]
    if len(exact) == 1:
        return exact[0]
    if exact or case_sensitive:
        return None
    folded = [c for c in columns if c.lower() == name.lower()]
    return folded[0] if len(folded) == 1 else None


def route_for(df: Any, other: Any | None) -> Any:
    """``groupedMap=auto``'s choice for grouping ``df`` (and a cogroup's ``other``): a
    ``route.Route`` (``path`` ``spark`` or ``arrowbeat``, ``reason``), decided by input size as
    ``route.choose`` decides, unless ``spark.arrowbeat.shuffle.path`` forces a path."""
    from spark_plugin.shuffle.driver.route import choose

    return choose(df, "group", other=other, unset="auto")


def take_over(offer: Offer, mode: str, route: Callable[[Any, Any | None], Any] = route_for) -> Decision:
    """arrowbeat's DataFrame for ``offer`` (``mode`` ``on`` or ``auto``), or why Spark's runs."""
    from spark_plugin.shuffle.driver.grouped import group_by
    from spark_plugin.shuffle.driver.handle import shuffle_of
    from spark_plugin.shuffle.driver.route import mark, record_spark_path, report
    from spark_plugin.shuffle.driver.shuffle_settings import shuffle_settings
    from spark_plugin.shuffle.worker.grouped_map import form_of

    spark = offer.sides[0].df.sparkSession
    if is_connect(spark):
        return Decision(None, "a Spark Connect session: arrowbeat takes over classic sessions only")
    case_sensitive = str(spark.conf.get("spark.sql.caseSensitive", "false")).lower() == "true"
    keys: list[tuple[str, ...]] = []
    for side in offer.sides:
        names = grouping_names(side, case_sensitive)
        if isinstance(names, str):
            return Decision(None, names)
        keys.append(names)
    try:
        shuffle_settings(spark)
    except ConfigError as exc:
        return Decision(None, f"arrowbeat's shuffle is not available here ({exc})")
    api = API[offer.method]
    try:
        form = form_of(offer.func, api, cogroup=offer.cogroup)
    except ShuffleConfigError as exc:
        return Decision(None, f"a function shape arrowbeat does not read ({exc})")
    if form.iterator and not iterator_forms():
        return Decision(
            None, "the iterator form, which this PySpark does not have (it passes the whole group)"
        )
    chosen = None
    if mode == "auto":
        chosen = route(offer.sides[0].df, offer.sides[1].df if offer.cogroup else None)
        if chosen.path != "arrowbeat":
            record_spark_path(spark, chosen)  # the choice's shuffle_metrics row
            return Decision(None, f"groupedMap=auto chose Spark's exchange: {chosen.reason}")
    grouped = group_by(offer.sides[0].df, *keys[0])
    target = grouped.cogroup(group_by(offer.sides[1].df, *keys[1])) if offer.cogroup else grouped
    if chosen is not None:
        target.input_size = chosen.size  # read once: the route's statistics plan the shuffle too
    out = getattr(target, offer.method)(offer.func, offer.schema)
    if chosen is None:
        return Decision(out)
    shuffle_of(out).collected([report(chosen)])  # the choice's row, written with the shuffle's
    return Decision(mark(out, chosen), chosen.reason)
