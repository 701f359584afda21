"""The documentation site's generated parts, made from the code at build time.

A page under ``docs/`` asks for a generated part with a marker line ``<!-- generated: NAME -->``;
``mkdocs build`` (through ``scripts/mkdocs_hooks.py``) replaces it with :data:`GENERATORS`' output for
``NAME``, so the configuration reference, the tables' schemas, the event kinds, the metrics lists and
the version matrix are never copies typed by hand: they are what ``spark_plugin/settings/config.py``,
``spark_plugin/history/tables.py``, ``heartbeat/events.py``, ``spark_plugin/jvm/plugin_metrics.py``
and ``scripts/matrix.py`` declare. An unknown name, or a declared name without its doc line, fails the
build (and ``tests/test_docs.py``), never renders empty.

    python -m scripts.docs_site NAME     print one generated part (e.g. config-table)
"""

from __future__ import annotations

import argparse
import ast
import inspect
import itertools
import re
import sys
from collections.abc import Callable

MARKER = re.compile(r"^<!-- generated: ([a-z0-9-]+) -->$", re.MULTILINE)

_PROTOCOL_EVENTS = {
    # The agent's own protocol kinds carry no docstring in heartbeat/events.py (its class doc
    # says what they are as a group); their one line each is here.
    "REGISTERED": "the executor's agent registered with the RM",
    "REREGISTERED": "an executor the RM knew registered again (after a timeout, a new agent or an RM "
    "restart); the detail says what the gap was, from the JVM's own evidence",
    "HEARTBEAT_TIMEOUT": "the executor answered no heartbeat for `spark.arrowbeat.heartbeat.timeout`",
    "UNREACHABLE": "`spark.arrowbeat.heartbeat.rpcFailureThreshold` heartbeat requests in a row failed "
    "(a broken stream)",
    "UNREGISTERED": "the agent unregistered: its JVM shut down or exited (the detail says which)",
}


class MissingDocError(Exception):
    """A declared name (a column, an event kind, a metric) has no doc line to show."""


def _one_line(text: str) -> str:
    """A docstring as one Markdown line: whitespace folded, reST's double backquotes made single."""
    return " ".join(text.replace("``", "`").split()).replace("|", "\\|")


def config_table() -> str:
    """Every user-facing ``spark.arrowbeat.*`` key: default, expected form, meaning."""
    from spark_plugin.settings.config import docs_table

    return docs_table()


def table_schemas() -> str:
    """Each Delta table arrowbeat writes: its columns, their Arrow types, what they hold."""
    from spark_plugin.history.tables import COLUMN_DOCS, EXECUTOR_EVENTS, HEARTBEATS, SHUFFLE_METRICS

    parts: list[str] = []
    for spec, writer in (
        (HEARTBEATS, "the RM, one row per heartbeat received"),
        (EXECUTOR_EVENTS, "the RM, one row per lifecycle event"),
        (SHUFFLE_METRICS, "the application's driver, one row per shuffle task report or routing decision"),
    ):
        docs = COLUMN_DOCS.get(spec.name, {})
        rows = [f"### `{spec.name}`", "", f"Written by {writer}.", "", "| column | type | meaning |"]
        rows.append("| --- | --- | --- |")
        for field in spec.schema:
            if field.name not in docs:
                raise MissingDocError(f"{spec.name}.{field.name} has no entry in tables.COLUMN_DOCS")
            rows.append(f"| `{field.name}` | `{field.type}` | {_one_line(docs[field.name])} |")
        extra = set(docs) - set(spec.schema.names)
        if extra:
            raise MissingDocError(f"tables.COLUMN_DOCS[{spec.name!r}] names no column {sorted(extra)}")
        parts.append("\n".join(rows))
    return "\n\n".join(parts)


def _member_docstrings(cls: type) -> dict[str, str]:
    """The docstrings written under a class's attributes (as Sphinx's autodoc reads them)."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    found: dict[str, str] = {}
    for here, after in itertools.pairwise(body):
        if (
            isinstance(here, ast.Assign)
            and len(here.targets) == 1
            and isinstance(here.targets[0], ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            found[here.targets[0].id] = after.value.value
    return found


def event_kinds() -> str:
    """Every ``executor_events.event`` value and what it means (``heartbeat.EventKind``)."""
    from heartbeat import EventKind

    documented = _member_docstrings(EventKind)
    rows = ["| event | meaning |", "| --- | --- |"]
    for kind in EventKind:
        doc = documented.get(kind.name) or _PROTOCOL_EVENTS.get(kind.name)
        if not doc:
            raise MissingDocError(f"EventKind.{kind.name} has no docstring in heartbeat/events.py")
        rows.append(f"| `{kind.name}` | {_one_line(doc)} |")
    return "\n".join(rows)


def _metrics_table(names: list[str]) -> str:
    from spark_plugin.jvm.plugin_metrics import METRIC_DOCS

    rows = ["| metric | meaning |", "| --- | --- |"]
    for name in names:
        if name not in METRIC_DOCS:
            raise MissingDocError(f"metric {name} has no entry in plugin_metrics.METRIC_DOCS")
        rows.append(f"| `{name}` | {_one_line(METRIC_DOCS[name])} |")
    return "\n".join(rows)


def driver_metrics() -> str:
    """The driver's gauges: the fixed names, the per-executor ones, the JVM's own."""
    from spark_plugin.jvm.plugin_metrics import DRIVER_METRICS, JVM_OWN_METRICS, PER_EXECUTOR

    per_executor = [f"executor.<id>.{name}" for name in PER_EXECUTOR]
    return _metrics_table([*sorted(DRIVER_METRICS), *per_executor, *JVM_OWN_METRICS])


def executor_metrics() -> str:
    """An executor's gauges (its agent's shuffle figures) and the JVM's own."""
    from spark_plugin.jvm.plugin_metrics import EXECUTOR_METRICS, JVM_OWN_METRICS

    return _metrics_table([*sorted(EXECUTOR_METRICS), *JVM_OWN_METRICS])


def matrix_table() -> str:
    """The version matrix's cells and their locked versions (``scripts/matrix.py``)."""
    from scripts import matrix

    return matrix.table()


GENERATORS: dict[str, Callable[[], str]] = {
    "config-table": config_table,
    "table-schemas": table_schemas,
    "event-kinds": event_kinds,
    "driver-metrics": driver_metrics,
    "executor-metrics": executor_metrics,
    "matrix-table": matrix_table,
}


def expand(markdown: str, page: str = "a page") -> str:
    """``markdown`` with every generated marker replaced by its part (raises for an unknown one)."""

    def part(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise KeyError(f"{page}: no generated part {name!r}; known: {', '.join(sorted(GENERATORS))}")
        return GENERATORS[name]()

    return MARKER.sub(part, markdown)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.docs_site", description=__doc__)
    parser.add_argument("name", choices=sorted(GENERATORS))
    args = parser.parse_args(argv)
    print(GENERATORS[args.name]())
    return 0


if __name__ == "__main__":
    sys.exit(main())
