"""Issue 38, item 8: in the checkout's venv (``make setup``, the README's quick start) an unchanged
``applyInPandas`` job with ``spark.arrowbeat.shuffle.groupedMap=on`` runs on arrowbeat's shuffle,
as it does where the wheel is installed, and returns Spark's rows. Before, the editable install
had no ``arrowbeat.pth`` and the job silently stayed on Spark's path (no arrowbeat exchange).

The job is a script of its own (``apps/grouped_map_user.py``), run by ``.venv/bin/python`` from a
folder outside the checkout and without ``PYTHONPATH``, as a user runs one: only the installation
can put the hook in. The run marker is inherited, so the suite's final check finds anything left.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.installed import ROOT

pytestmark = pytest.mark.spark
VENV_PYTHON = ROOT / ".venv" / "bin" / "python"
USER_SCRIPT = Path(__file__).resolve().parent / "apps" / "grouped_map_user.py"
EXPECTED = [[k, len(range(k, 2000, 7)), sum(range(k, 2000, 7))] for k in range(7)]
"""``id % 7`` over 0..1999: per key its count and the sum of its ids."""


def run_user_script(mode: str, cwd: Path) -> dict[str, dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYSPARK_PYTHON"] = env["PYSPARK_DRIVER_PYTHON"] = str(VENV_PYTHON)
    done = subprocess.run(
        [str(VENV_PYTHON), str(USER_SCRIPT), mode, str(cwd)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    found = {}
    for line in done.stdout.splitlines():
        name, _, payload = line.partition(" ")
        if name in ("JOB", "SPARK"):
            found[name] = json.loads(payload)
    assert set(found) == {"JOB", "SPARK"}, done.stdout[-2000:] + done.stderr[-4000:]
    return found


def test_an_unchanged_apply_in_pandas_with_grouped_map_on_runs_on_arrowbeat_in_the_checkouts_venv(
    tmp_path: Path,
) -> None:
    found = run_user_script("on", tmp_path)
    job, spark = found["JOB"], found["SPARK"]
    assert job["arrowbeat"], "the job stayed on Spark's path:\n" + job["plan"]
    assert "FlatMapGroupsInPandas" not in job["plan"]
    assert not spark["arrowbeat"] and "FlatMapGroupsInPandas" in spark["plan"], spark["plan"]
    assert job["rows"] == spark["rows"] == EXPECTED
