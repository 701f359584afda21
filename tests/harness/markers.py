"""The ``spark`` marker by folder and by fixture, so ``make unit`` (``-m 'not spark'``) starts no
JVM and builds no wheel without each module having to remember its ``pytestmark``.

``tests/conftest.py`` imports the hook below; a test is marked ``spark`` when it lives under one
of ``SPARK_FOLDERS`` or uses one of ``JVM_FIXTURES`` (directly or through another fixture). Tests
marked ``chaos`` run last."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness import shards

TESTS = Path(__file__).resolve().parent.parent
SPARK_FOLDERS = (TESTS / "spark", TESTS / "compat")
"""Every test here starts Spark (a session, spark-submit, a standalone cluster, a Connect server)
or a JVM of its own; tests that need neither live beside the code they test."""
JVM_FIXTURES = frozenset(
    {"installed_wheel", "jvm", "spark_local", "shuffle_cluster", "frozen_run", "frozen_kill_run"}
)
"""Fixtures that build a wheel (javac inside) or start a JVM, wherever the test using them lives
(``jvm``: the Java end of ``tests/spark_plugin/test_protocol_contract.py``)."""


def needs_jvm(item: pytest.Item) -> bool:
    """Whether ``item`` starts a JVM or builds a wheel, by where it lives and what it uses."""
    path = Path(str(item.path)).resolve()
    if any(path.is_relative_to(folder) for folder in SPARK_FOLDERS):
        return True
    return not JVM_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))


LAST = ("chaos",)
"""Markers whose tests run after every other test of the session: the chaos soak's short form
(minutes of faults on a cluster of its own) runs when the session's other applications are done.
``make test`` runs it in a session of its own, after the others (``scripts/run_tests.py``)."""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Adds the ``spark`` marker to every collected test that ``needs_jvm``, and moves the tests
    of a ``LAST`` marker to the end; with ``--spark-shard``, keeps one shard (``shards.select``)."""
    for item in items:
        if needs_jvm(item) and item.get_closest_marker("spark") is None:
            item.add_marker(pytest.mark.spark)
    items.sort(key=lambda item: any(item.get_closest_marker(m) for m in LAST))  # stable: order kept
    shards.select(config, items)
