"""The wheel holds the product packages, all of them, and nothing else: pyproject.toml lists its
packages by hand (one of them, ``spark_plugin.jobs``, lives in ``jobs/``), so this keeps the list
complete as packages are added, and keeps ``tests``, ``benchmarks`` and ``scripts`` out."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("heartbeat", "arrow_shuffle", "spark_plugin")


def setuptools_table() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]  # type: ignore[no-any-return]


def packages_on_disk() -> set[str]:
    found = set()
    for top in PRODUCT:
        for init in (ROOT / top).rglob("__init__.py"):
            found.add(".".join(init.parent.relative_to(ROOT).parts))
    return found


def test_every_product_package_is_in_the_wheel_and_nothing_else() -> None:
    table = setuptools_table()
    listed = set(table["packages"])  # type: ignore[call-overload]
    assert listed == packages_on_disk() | {"spark_plugin.jobs"}
    assert table["package-dir"] == {"spark_plugin.jobs": "jobs"}
    assert not {p for p in listed if p.split(".")[0] in ("tests", "benchmarks", "scripts", "jobs")}


def test_the_jobs_import_each_other_by_their_installed_name() -> None:
    """``spark-submit jobs/x.py`` runs a job as a script; what it imports of its siblings must be
    ``spark_plugin.jobs.*``, the name that exists both in the checkout's editable install and in
    an installed wheel (a top-level ``jobs`` exists in neither)."""
    offenders = [
        f"{path.name}: {line.strip()}"
        for path in sorted((ROOT / "jobs").glob("*.py"))
        for line in path.read_text().splitlines()
        if line.strip().startswith(("from jobs", "import jobs"))
    ]
    assert not offenders, offenders
