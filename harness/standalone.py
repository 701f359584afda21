"""A real Spark standalone cluster for tests and benchmarks: a Master and two Workers, each Worker
its own "host", started from the pip package's ``spark-class``.

Each Worker gets what a separate machine would give it: its own loopback address (``--host`` and
``SPARK_LOCAL_IP``: 127.0.0.2, 127.0.0.3), its own work dir, and its own temp dir, in one of two
variants:

- ``"tmpdir"``: ``TMPDIR`` (and ``java.io.tmpdir`` for every JVM under the Worker, through
  ``JAVA_TOOL_OPTIONS``) points at a folder of its own, as hosts and container managers set it;
- ``"private-tmp"``: the Worker runs in a private mount namespace (``unshare -m``) with a folder
  of its own bind-mounted on ``/tmp``: its own disk behind the same path. Needs root or user
  namespaces; ``private_tmp_unavailable()`` says why not, for a skip.

``SPARK_LOCAL_DIRS`` is unset for the Workers, so each falls back to its own temp dir, as an
unconfigured host does. Everything inherits the test-run marker (``harness.procs.MARKER``); the
cluster ends every process it started (Master, Workers and everything under them) by pid.

The one set-up of a client-mode application on it (``standalone_app``: the cluster, a session
whose driver runs here, both executors up) serves ``tests/spark/test_standalone.py`` and
``benchmarks/cluster_faults.py``, with the adaptive ``group_apply`` job both run (``keyed_source``,
``summary``)::

    with standalone_app(scratch / "cluster", scratch, "name", conf) as app:
        app.cluster.freeze(app.cluster.workers[0])  # SIGSTOP the whole host
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import psutil
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession

from harness.env import with_java_option
from harness.procs import end, wait_until
from harness.session import build_session, stop_session

SPARK_CLASS = str(Path(sys.executable).parent / "spark-class")
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
MASTER_HOST = "127.0.0.1"
WORKER_HOSTS = ("127.0.0.2", "127.0.0.3")
START_TIMEOUT_S = 90.0
Variant = Literal["tmpdir", "private-tmp"]

# Inside the Worker's new mount namespace: a private folder on /tmp, then the folders every host
# shares (the test scratch folder, the checkout and its venv, where they live under /tmp, as in a
# CI clone) mounted back at their own paths through descriptors opened before /tmp was covered
# (``/proc/self/fd/N`` taken as it is: resolved by name, it would lead into the private folder).
# Arguments: the private folder, three shared folders (repeated if fewer), the command.
_PRIVATE_TMP = """\
exec 3<"$2" 4<"$3" 5<"$4" || exit 97
mount --bind "$1" /tmp || exit 98
for shared in "3 $2" "4 $3" "5 $4"; do
  fd=${shared%% *}; dir=${shared#* }
  case "$dir" in
    /tmp/*) mkdir -p "$dir" && mount --no-canonicalize --bind "/proc/self/fd/$fd" "$dir" || exit 99;;
  esac
done
exec 3<&- 4<&- 5<&-
shift 4
exec "$@"
"""


def shared_folders(scratch: Path) -> list[str]:
    """The three folders kept visible under a private /tmp: the top folders under /tmp of the
    scratch folder, the checkout (tests are imported from it) and the venv."""
    checkout = Path(__file__).resolve().parents[1]
    return [str(shared_top(scratch)), str(shared_top(checkout)), str(shared_top(Path(sys.prefix)))]


def free_port(host: str = MASTER_HOST) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@functools.cache
def private_tmp_unavailable() -> str:
    """Why the ``private-tmp`` variant cannot run here ("" if it can): probed once per process."""
    with tempfile.TemporaryDirectory(prefix="arrowbeat-unshare-") as shared:
        private = Path(shared, "private")
        private.mkdir()
        check = f"touch {shlex.quote(shared)}/shared /tmp/private"
        unshare = [*_unshare(), "sh", "-c", _PRIVATE_TMP, "sh", str(private), *shared_folders(Path(shared))]
        try:
            done = subprocess.run([*unshare, "sh", "-c", check], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"unshare cannot run: {exc}"
        if done.returncode != 0:
            return f"no private mount namespace here ({shlex.join(unshare[:3])}: {done.stderr.strip()})"
        if not (Path(shared, "shared").exists() and (private / "private").exists()):
            return "a private /tmp hides the shared folder here"
    return ""


def _unshare() -> list[str]:
    """Root may create a mount namespace directly; others need a user namespace around it."""
    return ["unshare", "-m", "--propagation", "private"] if os.geteuid() == 0 else ["unshare", "-rm"]


@dataclass
class Worker:
    """One Worker "host": its address, its own temp and work dirs, and its JVM."""

    name: str
    host: str
    tmpdir: Path
    """The host's temp dir as the host sees it (``/tmp`` in the ``private-tmp`` variant)."""
    private_dir: Path
    """Where that temp dir's files are, seen from outside the host (this test process)."""
    work_dir: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"worker {self.name} is not running"
        return self.proc.pid


@dataclass
class StandaloneCluster:
    """A running Master and its Workers; ``stop()`` (or leaving the ``with``) ends them all."""

    root: Path
    variant: Variant
    master_port: int
    webui_port: int
    workers: list[Worker]
    cores: int = 1
    master: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _started: list[psutil.Process] = field(default_factory=list, repr=False)

    @property
    def master_url(self) -> str:
        return f"spark://{MASTER_HOST}:{self.master_port}"

    @classmethod
    def start(cls, root: Path, variant: Variant = "tmpdir", cores: int = 1) -> StandaloneCluster:
        """A Master and two Workers of ``cores`` cores and 1 GiB each, returned once the Master
        lists both Workers ALIVE."""
        if variant == "private-tmp" and (why := private_tmp_unavailable()):
            raise RuntimeError(why)
        root.mkdir(parents=True, exist_ok=True)
        workers = []
        for index, host in enumerate(WORKER_HOSTS):
            name = f"host{index + 2}"
            private = root / name / "tmp"
            private.mkdir(parents=True, exist_ok=True)
            workers.append(
                Worker(
                    name=name,
                    host=host,
                    tmpdir=Path("/tmp") if variant == "private-tmp" else private,
                    private_dir=private,
                    work_dir=root / name / "work",
                    log=root / f"{name}.log",
                )
            )
        cluster = cls(root, variant, free_port(), free_port(), workers, cores)
        try:
            cluster._start_master()
            for worker in workers:
                cluster.start_worker(worker)
            cluster.wait_alive(workers)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def __enter__(self) -> StandaloneCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- processes -------------------------------------------------------------------------------
    def _start_master(self) -> None:
        command = [SPARK_CLASS, MASTER_CLASS, "--host", MASTER_HOST, "--port", str(self.master_port)]
        command += ["--webui-port", str(self.webui_port)]
        env = dict(os.environ, SPARK_LOCAL_IP=MASTER_HOST)
        env.pop("SPARK_LOCAL_DIRS", None)
        self.master = self._spawn(command, env, self.root / "master.log")

    def start_worker(self, worker: Worker) -> None:
        """Starts (or, after ``kill``, restarts) the Worker of one host; see ``wait_alive``."""
        worker.work_dir.mkdir(parents=True, exist_ok=True)
        command = [SPARK_CLASS, WORKER_CLASS, "--host", worker.host, "--webui-port", str(free_port())]
        command += [
            "--cores",
            str(self.cores),
            "--memory",
            "1g",
            "--work-dir",
            str(worker.work_dir),
            self.master_url,
        ]
        env = dict(os.environ, SPARK_LOCAL_IP=worker.host, SPARK_WORKER_DIR=str(worker.work_dir))
        env.pop("SPARK_LOCAL_DIRS", None)  # like an unconfigured host: Spark falls back to its temp dir
        env["TMPDIR"] = str(worker.tmpdir)
        if self.variant == "private-tmp":
            wrapper = [
                *_unshare(),
                "sh",
                "-c",
                _PRIVATE_TMP,
                "sh",
                str(worker.private_dir),
                *shared_folders(self.root),
            ]
            command = [*wrapper, *command]
        else:
            with_java_option(env, f"-Djava.io.tmpdir={worker.tmpdir}")
        worker.proc = self._spawn(command, env, worker.log)

    def _spawn(self, command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env)
        self._started.append(psutil.Process(proc.pid))
        return proc

    def state(self) -> dict[str, Any]:
        """The Master's own view (its web UI's ``/json/``): workers, their state, applications."""
        url = f"http://{MASTER_HOST}:{self.webui_port}/json/"
        with urllib.request.urlopen(url, timeout=5) as reply:
            return json.loads(reply.read())  # type: ignore[no-any-return]

    def alive_hosts(self) -> set[str]:
        try:
            workers = self.state().get("workers", [])
        except (OSError, ValueError):  # not serving yet, or an empty page while the Master starts
            return set()
        return {str(w["host"]) for w in workers if w.get("state") == "ALIVE"}

    def wait_alive(self, workers: list[Worker], timeout_s: float = START_TIMEOUT_S) -> None:
        want = {w.host for w in workers}
        if not wait_until(lambda: want <= self.alive_hosts(), timeout_s, interval_s=0.2):
            logs = "\n".join(f"--- {w.log}\n{tail(w.log)}" for w in workers)
            raise AssertionError(
                f"workers {sorted(want - self.alive_hosts())} not ALIVE in {timeout_s}s\n{logs}"
            )

    def processes_of(self, worker: Worker) -> list[psutil.Process]:
        """The Worker's JVM and every process under it (executors, drivers, agents, Python workers)."""
        if worker.proc is None or worker.proc.poll() is not None:
            return []
        try:
            top = psutil.Process(worker.pid)
            return [top, *top.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def executors_of(self, worker: Worker) -> list[psutil.Process]:
        """The executor JVMs this Worker launched."""
        found = []
        for proc in self.processes_of(worker):
            with contextlib.suppress(psutil.Error):
                if "CoarseGrainedExecutorBackend" in " ".join(proc.cmdline()):
                    found.append(proc)
        return found

    def executor_id(self, worker: Worker) -> str:
        """The id of the one executor this Worker runs (``--executor-id N`` in its command line)."""
        jvms = self.executors_of(worker)
        if len(jvms) != 1:
            raise AssertionError(f"{worker.name} runs {len(jvms)} executors, not one: {jvms}")
        args = jvms[0].cmdline()
        return args[args.index("--executor-id") + 1]

    def _signal_host(self, worker: Worker, action: str) -> list[psutil.Process]:
        """Applies ``action`` to the whole host until no new process appears under it (one may
        fork while the others are being stopped)."""
        done: dict[int, psutil.Process] = {}
        for _ in range(10):
            fresh = [p for p in self.processes_of(worker) if p.pid not in done]
            if not fresh:
                break
            for proc in fresh:
                with contextlib.suppress(psutil.Error):
                    getattr(proc, action)()
                done[proc.pid] = proc
        return list(done.values())

    def freeze(self, worker: Worker) -> list[psutil.Process]:
        """SIGSTOP on the Worker and every process under it: the whole host hangs."""
        return self._signal_host(worker, "suspend")

    def thaw(self, worker: Worker) -> float:
        """SIGCONT on the Worker and every process under it; returns the wall time taken just
        before the first SIGCONT. Whatever the host records after it (a re-registration may come
        within milliseconds, before the caller could read a clock) is this thaw's doing."""
        procs = list(reversed(self.processes_of(worker)))
        thawed_at = time.time()
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.resume()
        return thawed_at

    def kill(self, worker: Worker) -> None:
        """SIGKILL on the Worker and everything under it: the host is gone (``start_worker`` and
        ``wait_alive`` bring a new Worker up on the same address)."""
        procs = self._signal_host(worker, "kill")
        psutil.wait_procs(procs, timeout=30)
        if worker.proc is not None:
            worker.proc.wait(timeout=30)

    def stop(self) -> None:
        """Ends every process started here and everything under them, by pid."""
        everything: dict[int, psutil.Process] = {}
        for proc in self._started:
            with contextlib.suppress(psutil.Error):
                if proc.is_running():
                    for p in [proc, *proc.children(recursive=True)]:
                        everything[p.pid] = p
        # Workers (and what runs under them) first: a Worker that loses its Master retries for long.
        order = sorted(everything.values(), key=lambda p: p.pid == (self.master.pid if self.master else -1))
        end(order)
        for popen in [self.master, *(w.proc for w in self.workers)]:
            if popen is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    popen.wait(timeout=10)


@dataclass
class StandaloneApp:
    """A client-mode application on a running cluster: its session and its history tables."""

    cluster: StandaloneCluster
    spark: SparkSession
    tables: Path


def spark_executors(spark: SparkSession) -> int:
    """How many executors Spark's driver has (the driver itself not counted)."""
    return int(spark.sparkContext._jsc.sc().getExecutorIds().size())


@contextlib.contextmanager
def standalone_app(
    root: Path,
    scratch: Path,
    name: str,
    conf: dict[str, str],
    ready: Callable[[StandaloneApp], object] | None = None,
    timeout_s: float = START_TIMEOUT_S,
) -> Iterator[StandaloneApp]:
    """A cluster under ``root`` and a session on it (driver here, client mode) with ``conf`` and
    its history tables in ``root / "tables"``, yielded once ``ready`` holds (by default: Spark has
    both executors); the session and then the cluster are ended on the way out."""
    tables = root / "tables"
    with StandaloneCluster.start(root) as cluster:
        spark = build_session(
            cluster.master_url, scratch, name, conf={**conf, "spark.arrowbeat.tables.path": str(tables)}
        )
        try:
            app = StandaloneApp(cluster, spark, tables)
            check = ready or (lambda a: spark_executors(a.spark) == len(a.cluster.workers))
            if not wait_until(lambda: check(app), timeout_s, interval_s=0.2):
                raise AssertionError(f"{name} not ready within {timeout_s:g}s on {cluster.master_url}")
            yield app
        finally:
            stop_session(spark)


# -- the job the standalone tests and benchmark shuffle ---------------------------------------------
SUMMARY = "k bigint, n bigint, sx double"


def keyed_source(spark: SparkSession, rows: int, keys: int) -> DataFrame:
    """``rows`` rows in four partitions: ``id``, a key ``k`` of ``keys`` values, a value ``x``."""
    return spark.range(0, rows, numPartitions=4).selectExpr(
        "id", f"pmod(hash(id), {keys}) AS k", "cast(id % 1000 AS double) AS x"
    )


def summary(table: pa.Table) -> pa.Table:
    """One key's rows -> its key, row count and sum of ``x`` (schema ``SUMMARY``)."""
    return pa.table(
        {
            "k": pa.array([table.column("k")[0].as_py()], pa.int64()),
            "n": pa.array([table.num_rows], pa.int64()),
            "sx": pa.array([pc.sum(table.column("x")).as_py()], pa.float64()),
        }
    )


def spark_summary(df: DataFrame) -> dict[int, tuple[int, float]]:
    """``summary`` per key through Spark's own shuffle: what an Arrow shuffle must equal."""
    return {r.k: (r.n, r.sx) for r in df.groupBy("k").applyInArrow(summary, SUMMARY).collect()}


def shared_top(path: Path) -> Path:
    """The folder directly under ``/tmp`` that holds ``path`` (kept visible on every host), or
    ``path`` itself when it is not under ``/tmp``."""
    path = path.resolve()
    if path.parts[:2] == ("/", "tmp") and len(path.parts) > 2:
        return Path(*path.parts[:3])
    return path


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return str(exc)
