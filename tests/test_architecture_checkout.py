"""The checkout's own rooms, beside the product's (``tests/test_architecture.py``): the tests, the
benchmarks and the harness they share. Neither the tests nor the benchmarks import the other:
what both need is in ``harness/`` (issue 38, item 5), which imports neither; the product imports
none of the three (they are not in the wheel).

Imports are read from the source as ``tests/test_architecture.py`` reads them (function-level
ones included, ``TYPE_CHECKING`` blocks excluded)."""

from __future__ import annotations

import ast

import pytest

from tests.test_architecture import PACKAGES, ROOT, _imports, _module_name

CHECKOUT = ("tests", "benchmarks", "harness")
MAY_IMPORT: dict[str, set[str]] = {"tests": {"harness"}, "benchmarks": {"harness"}, "harness": set()}
"""Which of the checkout's rooms each may import besides itself."""


def _wrong_imports(top: str, allowed: set[str]) -> list[str]:
    """Every import in ``top``'s files of a checkout room other than ``top`` and ``allowed``."""
    wrong = []
    for path in sorted((ROOT / top).rglob("*.py")):
        if "_pb2" in path.name:
            continue
        module = _module_name(path)
        tree = ast.parse(path.read_text(), str(path))
        for target, line in _imports(tree, module, path.name == "__init__.py"):
            there = target.split(".")[0]
            if there in CHECKOUT and there != top and there not in allowed:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    return sorted(set(wrong))


@pytest.mark.parametrize("top", CHECKOUT)
def test_tests_and_benchmarks_share_only_the_harness(top: str) -> None:
    wrong = _wrong_imports(top, MAY_IMPORT[top])
    assert not wrong, (
        "what tests and benchmarks both use belongs in harness/ (which imports neither):\n" + "\n".join(wrong)
    )


@pytest.mark.parametrize("top", PACKAGES)
def test_the_product_imports_nothing_of_the_checkout(top: str) -> None:
    assert not _wrong_imports(top, set())


def test_the_rule_sees_a_forbidden_import() -> None:
    """The scan finds a test's import of a benchmark, a function-level one included."""
    tree = ast.parse("def f():\n    from benchmarks.chaos import main\n")
    targets = {t for t, _ in _imports(tree, "tests.test_x", False)}
    assert "benchmarks.chaos" in targets
