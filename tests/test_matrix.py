"""The version matrix is what the README and pyproject say: a cell per supported Spark minor, the
primary one the newest Spark with a Delta release, every lock inside the declared ranges, and the
README's table generated from the cells and their locks. No venv is built here."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

from scripts import matrix
from spark_plugin.compat import versions

ROOT = Path(__file__).resolve().parent.parent


def pins(cell: matrix.Cell) -> dict[str, str]:
    found = {}
    for line in cell.lock.read_text().splitlines():
        name, sep, version = line.partition("==")
        if sep and not line.startswith("#"):
            found[name.strip().lower().replace("_", "-")] = version.strip()
    return found


def spark_minor(cell: matrix.Cell) -> tuple[int, int]:
    major, minor = versions.parse_version(pins(cell)["pyspark"])[:2]
    return major, minor


def test_every_supported_spark_minor_has_a_cell() -> None:
    assert sorted(spark_minor(c) for c in matrix.CELLS) == sorted(versions.SUPPORTED_SPARK_MINORS)


def test_the_primary_cell_is_the_newest_spark_with_a_delta_release() -> None:
    (primary,) = [c for c in matrix.CELLS if c.primary]
    assert spark_minor(primary) == max(versions.DELTA_ARTIFACTS)


def test_pythons_and_libraries_are_spread_across_the_cells() -> None:
    assert {c.python for c in matrix.CELLS} == {"3.11", "3.12", "3.13"}
    pyarrows = {versions.parse_version(pins(c)["pyarrow"]) for c in matrix.CELLS}
    assert min(pyarrows) == versions.MINIMUM_PYARROW  # the floor is tested, not only declared
    pandas_majors = {versions.parse_version(pins(c)["pandas"])[0] for c in matrix.CELLS}
    assert pandas_majors == {2, 3}


def test_every_lock_pins_its_seeds_and_meets_the_declared_ranges() -> None:
    declared = [
        Requirement(r)
        for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    ]
    for cell in matrix.CELLS:
        locked = pins(cell)
        for seed in cell.seeds:
            name, _, version = seed.partition("==")
            assert locked[name.lower()] == version, (cell.name, seed)
        for requirement in declared:
            version = locked[requirement.name.lower()]
            assert requirement.specifier.contains(version), (cell.name, str(requirement), version)


def test_the_readme_table_is_generated_from_the_cells() -> None:
    readme = (ROOT / "README.md").read_text()
    begin, end = "<!-- matrix-table -->\n", "\n<!-- /matrix-table -->"
    assert readme[readme.index(begin) + len(begin) : readme.index(end)] == matrix.table()


def test_every_compat_test_is_where_the_cells_collect() -> None:
    """A test marked ``compat`` outside ``matrix.COMPAT_TESTS`` would silently leave the matrix."""
    marked = {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "tests").rglob("*.py")
        if re.search(r"pytest\.mark\.compat\b", path.read_text())
    }
    assert marked, "no test is marked compat"
    outside = {p for p in marked if not any(p == c or p.startswith(c + "/") for c in matrix.COMPAT_TESTS)}
    assert not outside, f"marked compat but not collected by the matrix cells: {sorted(outside)}"
    for collected in matrix.COMPAT_TESTS:
        assert (ROOT / collected).exists(), collected
