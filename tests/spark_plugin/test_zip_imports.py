"""``zip_imports``: an unchanged archive keeps its directory across ``invalidate_caches``; a
changed one is re-read, so a module added to it is found (run in a child interpreter: the patch is
process-wide). ``compat.zipimport_cache`` decides where it is wanted: CPython before 3.12 under a
pyspark that invalidates every task (4.0, 4.1, or one it does not know), and only when CPython's
method is the one it expects."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from spark_plugin.compat.zipimport_cache import ZipPatchPoint, find_invalidate_caches

CHILD = textwrap.dedent(
    """
    import importlib, sys, zipfile, zipimport
    from spark_plugin.python_worker.zip_imports import skip_unchanged_archives

    archive = sys.argv[1]
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("first_mod.py", "VALUE = 1\\n")
    sys.path.insert(0, archive)
    import first_mod

    importer = sys.path_importer_cache[archive]
    reads = []
    real_read = zipimport._read_directory
    zipimport._read_directory = lambda path: reads.append(path) or real_read(path)

    # pyspark 4.0 invalidates every task (whatever this cell's pyspark is)
    assert skip_unchanged_archives(pyspark_version="4.0.5")
    assert skip_unchanged_archives(pyspark_version="4.0.5")  # idempotent
    importlib.invalidate_caches()  # first time: read once, remember the archive's stamp
    importlib.invalidate_caches()
    importlib.invalidate_caches()
    unchanged = len(reads)

    with zipfile.ZipFile(archive, "a") as z:
        z.writestr("second_mod.py", "VALUE = 2\\n")
    importlib.invalidate_caches()
    import second_mod

    print(unchanged, len(reads), first_mod.VALUE, second_mod.VALUE)
    """
)


NEEDS_PATCH = sys.version_info < (3, 12)
"""CPython 3.12+ re-reads a zip archive's directory lazily itself (gh-103200): nothing to patch."""


@pytest.mark.skipif(not NEEDS_PATCH, reason="Python 3.12+ re-reads zip archives lazily: no patch")
def test_unchanged_archives_are_not_reread_and_changed_ones_are(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "code.zip")],
        check=True,
        capture_output=True,
        text=True,
        cwd=Path(__file__).parents[2],
    ).stdout.split()
    assert out == ["1", "2", "1", "2"]


@pytest.mark.skipif(NEEDS_PATCH, reason="Python < 3.12 is patched: see the test above")
def test_nothing_is_patched_where_cpython_reads_lazily() -> None:
    from spark_plugin.python_worker.zip_imports import skip_unchanged_archives

    assert skip_unchanged_archives(pyspark_version="4.0.5") is False


@pytest.mark.parametrize(
    ("python", "pyspark", "wanted"),
    [
        ((3, 11), "4.0.5", True),
        ((3, 11), "4.1.4", True),
        ((3, 11), "4.4.0", True),  # unknown pyspark: the CPython patch is sound whatever it does
        ((3, 11), "4.2.1", False),  # invalidates only when a task adds a path
        ((3, 11), "4.3.0", False),
        ((3, 12), "4.0.5", False),
        ((3, 13), "4.1.4", False),
    ],
)
def test_the_patch_is_wanted_only_where_a_worker_rereads_every_task(
    python: tuple[int, int], pyspark: str, wanted: bool
) -> None:
    class Importer:
        def invalidate_caches(self) -> None:
            return None

    point = find_invalidate_caches(python, pyspark, Importer)
    assert (point.original is not None) == wanted and not point.unverified
    assert wanted or point.reason


@pytest.mark.parametrize(
    ("importer", "why"),
    [
        (types.SimpleNamespace(), "has no invalidate_caches"),
        (types.SimpleNamespace(invalidate_caches=lambda self, full: None), "not (self)"),
    ],
)
def test_an_unexpected_cpython_method_is_not_patched(importer: object, why: str) -> None:
    point = find_invalidate_caches((3, 11), "4.0.5", importer)
    assert point.original is None and point.unverified and why in point.reason


def test_an_unverified_patch_is_skipped_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import spark_plugin.python_worker.zip_imports as zip_imports

    monkeypatch.setattr(
        zip_imports,
        "find_invalidate_caches",
        lambda *_args: ZipPatchPoint(None, "zipimporter has no invalidate_caches", True),
    )
    assert zip_imports.skip_unchanged_archives() is False
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "has no invalidate_caches" in warnings[0]
