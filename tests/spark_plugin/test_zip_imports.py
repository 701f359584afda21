"""``zip_imports``: an unchanged archive keeps its directory across ``invalidate_caches``; a
changed one is re-read, so a module added to it is found. Run in a child interpreter: the patch
is process-wide."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

CHILD = textwrap.dedent(
    """
    import importlib, sys, zipfile, zipimport
    from spark_plugin.zip_imports import skip_unchanged_archives

    archive = sys.argv[1]
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("first_mod.py", "VALUE = 1\\n")
    sys.path.insert(0, archive)
    import first_mod

    importer = sys.path_importer_cache[archive]
    reads = []
    real_read = zipimport._read_directory
    zipimport._read_directory = lambda path: reads.append(path) or real_read(path)

    assert skip_unchanged_archives() and skip_unchanged_archives()  # idempotent
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
    from spark_plugin.zip_imports import skip_unchanged_archives

    assert skip_unchanged_archives() is False
