"""The ``spark`` marker by folder and by fixture, so ``make unit`` (``-m 'not spark'``) starts no
JVM and builds no wheel without each module having to remember its ``pytestmark``.

``tests/conftest.py`` imports the hook below; a test is marked ``spark`` when it lives under one
of ``SPARK_FOLDERS`` or uses one of ``JVM_FIXTURES`` (directly or through another fixture)."""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent.parent
SPARK_FOLDERS = (TESTS / "spark", TESTS / "compat")
"""Every test here starts Spark (a session, spark-submit, a standalone cluster, a Connect server)
or a JVM of its own; tests that need neither live beside the code they test."""
JVM_FIXTURES = frozenset({"installed_wheel", "java_check", "jvm", "spark_local", "spark_cluster"})
"""Fixtures that build a wheel (javac inside) or start a JVM, wherever the test using them lives
(``jvm``: the Java end of ``tests/spark_plugin/test_protocol_contract.py``)."""


def needs_jvm(item: pytest.Item) -> bool:
    """Whether ``item`` starts a JVM or builds a wheel, by where it lives and what it uses."""
    path = Path(str(item.path)).resolve()
    if any(path.is_relative_to(folder) for folder in SPARK_FOLDERS):
        return True
    return not JVM_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Adds the ``spark`` marker to every collected test that ``needs_jvm``."""
    for item in items:
        if needs_jvm(item) and item.get_closest_marker("spark") is None:
            item.add_marker(pytest.mark.spark)
