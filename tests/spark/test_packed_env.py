"""Executors without arrowbeat (issue 15, item 4): on a standalone cluster whose Workers' Python
has no arrowbeat, ``spark-submit $(python -m spark_plugin pack -o env.tar.gz) job.py`` from a venv
where arrowbeat's wheel is installed ships the packed environment; Spark unpacks it as ``./env`` in
each executor's working directory, and the agents and the Python workers run its
``./env/bin/python`` (relative ``spark.arrowbeat.python``, resolved by the JVM where it launches the
agent). An interpreter that does not exist on the executors: no agent, one log line per executor
naming key, path and executor, and the job runs on.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.procs import APP_MARKER, end, ours
from harness.session import DELTA_SNAPSHOT_PARTITIONS
from harness.standalone import StandaloneCluster
from tests.installed import Installed, clean_env, spark_lock

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.standalone]

ROOT = Path(__file__).resolve().parent.parent.parent
# The Workers' own Python: the interpreter every venv here was made from, without arrowbeat.
HOST_PYTHON = getattr(sys, "_base_executable", "python3")


@pytest.fixture(scope="module")
def cluster(scratch: Path) -> Iterator[StandaloneCluster]:
    """Two Worker hosts whose environment has no arrowbeat: no checkout on ``PYTHONPATH``, the
    plain interpreter as ``PYSPARK_PYTHON``; Spark installed (``SPARK_HOME``: the pip package's)."""
    import pyspark

    with pytest.MonkeyPatch.context() as env:
        env.setenv("SPARK_HOME", str(Path(pyspark.__file__).parent))
        for key in ("PYTHONPATH", "PYSPARK_DRIVER_PYTHON"):
            env.delenv(key, raising=False)
        env.setenv("PYSPARK_PYTHON", HOST_PYTHON)
        env.setenv("PATH", clean_env()["PATH"])
        with spark_lock(), StandaloneCluster.start(scratch / "packed-env") as started:
            yield started


def submit(installed: Installed, flags: list[str], job: Path, cluster: StandaloneCluster, *args: str) -> str:
    """Runs ``job`` with ``flags`` from its own directory on the cluster; returns its stdout."""
    marker = uuid.uuid4().hex
    command = [str(installed.venv / "bin" / "spark-submit"), *flags, "--master", cluster.master_url]
    for key, value in {
        "spark.cores.max": "2",
        "spark.executor.cores": "1",
        "spark.executor.memory": "512m",
        "spark.driver.memory": "512m",
        "spark.ui.enabled": "false",
        "spark.log.level": "WARN",
        # The job's Delta write and read: Delta rebuilds the table's state in 50 tasks by default,
        # the job's slowest step on two 1-core executors (22 s; 12 s with 2, as harness.session).
        DELTA_SNAPSHOT_PARTITIONS[0]: DELTA_SNAPSHOT_PARTITIONS[1],
        "spark.driver.extraJavaOptions": f"-Dderby.system.home={job.parent}",
    }.items():
        command += ["--conf", f"{key}={value}"]
    command += [str(job), *args]
    try:
        done = subprocess.run(
            command,
            cwd=job.parent,
            env=installed.env(**{APP_MARKER: marker}),
            capture_output=True,
            text=True,
            timeout=400,
        )
    finally:
        end(ours(app=marker))
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return done.stdout


def test_the_hosts_python_has_no_arrowbeat(tmp_path: Path) -> None:
    """The control: what the Workers would run without the archive cannot import arrowbeat."""
    command = [HOST_PYTHON, "-c", "import spark_plugin"]
    done = subprocess.run(command, cwd=tmp_path, env=clean_env(), capture_output=True)
    assert done.returncode != 0


def test_executors_run_arrowbeat_from_the_packed_environment(
    installed_wheel: Installed, cluster: StandaloneCluster, tmp_path: Path
) -> None:
    started = time.monotonic()
    packed = subprocess.run(
        [str(installed_wheel.python), "-m", "spark_plugin", "pack", "-o", str(tmp_path / "env.tar.gz")],
        cwd=tmp_path,
        env=installed_wheel.env(),
        check=True,
        capture_output=True,
        text=True,
    )
    pack_s = time.monotonic() - started
    flags = shlex.split(packed.stdout)
    assert flags[flags.index("--archives") + 1] == f"{tmp_path / 'env.tar.gz'}#env"
    job = shutil.copy(ROOT / "tests" / "wheel_job.py", tmp_path / "job.py")
    started = time.monotonic()
    with spark_lock():
        out = submit(installed_wheel, flags, Path(job), cluster, "--executors", "2")
    print(
        f"pack {pack_s:.1f} s ({(tmp_path / 'env.tar.gz').stat().st_size / 2**20:.0f} MiB), "
        f"job {time.monotonic() - started:.1f} s; {packed.stderr.strip()}"
    )
    [line] = [line for line in out.splitlines() if line.startswith("WHEEL-JOB ")]
    report = json.loads(line.removeprefix("WHEEL-JOB "))
    print(f"job steps (s): {report['seconds']}")
    assert {agent.split("@")[1] for agent in report["agents"]} == {w.host for w in cluster.workers}, report
    assert report["same_rows"] and report["one_partition_per_key"] and report["delta_rows"] == 5, report
    work_dirs = tuple(str(w.work_dir / report["app_id"]) for w in cluster.workers)
    for python in report["agent_pythons"] + report["worker_pythons"]:
        assert python.startswith(work_dirs) and python.endswith("/env/bin/python"), report
    assert len(report["agent_pythons"]) == 2, report
    assert report["spark_plugin"].startswith(str(installed_wheel.site_packages)), report  # not the checkout


MISSING_JOB = """\
from pyspark.sql import SparkSession
spark = SparkSession.builder.getOrCreate()
total = spark.sparkContext.parallelize(range(100), 4).map(lambda x: x * 2).sum()
print("MISSING-JOB", spark.sparkContext.applicationId, total, flush=True)
spark.stop()
"""


def test_a_missing_interpreter_leaves_one_line_per_executor_and_the_job_runs_on(
    installed_wheel: Installed, cluster: StandaloneCluster, tmp_path: Path
) -> None:
    """Executors with no ``./missing/bin/python`` start no agent and say so once each; the driver
    side runs its own interpreter (``spark.arrowbeat.driver.python``); tasks run on the hosts'
    plain Python."""
    job = tmp_path / "job.py"
    job.write_text(MISSING_JOB)
    conf = subprocess.run(
        [str(installed_wheel.python), "-m", "spark_plugin", "conf", "--python", "./missing/bin/python"],
        env=installed_wheel.env(),
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    flags = [*shlex.split(conf), "--conf", f"spark.arrowbeat.driver.python={installed_wheel.python}"]
    flags += ["--conf", f"spark.pyspark.python={HOST_PYTHON}"]
    with spark_lock():
        out = submit(installed_wheel, flags, job, cluster)
    [line] = [line for line in out.splitlines() if line.startswith("MISSING-JOB ")]
    _, app_id, total = line.split()
    assert total == str(2 * sum(range(100)))
    logs = sorted(p for w in cluster.workers for p in (w.work_dir / app_id).glob("*/stderr"))
    assert len(logs) == 2, logs
    for log in logs:
        executor = log.parent.name
        said = [
            ln for ln in log.read_text().splitlines() if "spark.arrowbeat.python=./missing/bin/python" in ln
        ]
        assert len(said) == 1, (log, said)
        assert f"executor {executor}" in said[0] and os.sep + "missing" in said[0], said
