"""The application secret stays secret through a full run (issue 13, item 6).

One spark-submit application on local-cluster[2,1,1024] with a known secret (configured in a
``spark-defaults.conf``, so it is in nobody's argv to begin with) and TLS on (so the driver-side
process generates a private key that travels to the executors beside the secret and must stay
as secret as it), arrowbeat at log level debug,
fast heartbeats and history tables: heartbeats flow, an Arrow shuffle runs (and is released, so
its metrics are recorded), one executor JVM is SIGKILLed (events recorded, a replacement agent
starts), a second shuffle runs. Then the secret's bytes are searched for in every log, every
file of the history tables and the shuffle root, and in ``/proc/<pid>/cmdline`` and
``/proc/<pid>/environ`` of every process of the application while it ran. Each search first
shows it can find something (the places hold what they should), so a pass is not an empty scan.
"""

from __future__ import annotations

import os
import secrets
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from harness.apps import HOLD_APP
from harness.history_read import events, rows
from harness.procs import ours, wait_until
from harness.submit import SubmittedApp, executor_dirs

pytestmark = pytest.mark.spark
GENEROUS_S = 60.0
ROLES = (
    "spark_plugin.processes.driver",
    "spark_plugin.processes.executor",
    "SparkSubmit",
    "CoarseGrainedExecutorBackend",
)


@dataclass
class Run:
    secret: bytes
    spark_secret: bytes
    """Spark's own ``spark.authenticate.secret``: the Worker hands it to executor JVMs in their
    environment (``_SPARK_AUTH_SECRET``); arrowbeat's processes must not inherit it."""
    conf_file: Path
    tables: Path
    shuffle_root: Path
    log: bytes = b""
    stdout: bytes = b""
    exit_code: int | None = None
    shuffle_files_while_running: dict[str, bytes] = field(default_factory=dict)
    proc_files: dict[str, bytes] = field(default_factory=dict)
    """``"<pid> <cmdline words> <cmdline|environ>"`` -> raw bytes of that /proc file."""
    arrowbeat_pids: set[int] = field(default_factory=set)
    tls_key: bytes = b""
    """The generated TLS private key as it travels (base64 of its DER on one line)."""

    def needles(self) -> dict[str, bytes]:
        """What must appear nowhere: the secret, and the TLS key in its one-line form and as the first
        line of its PEM form (base64 wrapped at 64 characters)."""
        return {"secret": self.secret, "tls key": self.tls_key, "tls key (PEM line)": self.tls_key[:64]}


def files_under(root: Path) -> dict[str, bytes]:
    """Every regular file below ``root``, path -> bytes (files that vanish meanwhile are skipped)."""
    found: dict[str, bytes] = {}
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = Path(dirpath, name)
            try:
                if path.is_file() and not path.is_symlink():
                    found[str(path)] = path.read_bytes()
            except OSError:
                continue
    return found


def snapshot_processes(run: Run, marker: str) -> None:
    """cmdline and environ of every live process of the application, as the kernel shows them."""
    for proc in ours(app=marker):
        try:
            words = " ".join(proc.cmdline())
            role = next((r for r in ROLES if r in words), proc.name())
            for what in ("cmdline", "environ"):
                run.proc_files[f"{proc.pid} {role} {what}"] = Path(f"/proc/{proc.pid}/{what}").read_bytes()
            if role in ROLES[:2]:
                run.arrowbeat_pids.add(proc.pid)
        except (OSError, psutil.Error):
            continue


def holding(files: dict[str, bytes], secret: bytes) -> list[str]:
    return sorted(name for name, data in files.items() if secret in data)


def leaks(run: Run, files: dict[str, bytes]) -> dict[str, list[str]]:
    """Which of ``files`` hold any of the run's secrets, by secret."""
    found = {what: holding(files, needle) for what, needle in run.needles().items()}
    return {what: names for what, names in found.items() if names}


@pytest.fixture(scope="module")
def run(scratch: Path) -> Iterator[Run]:
    secret = "s3cret-" + secrets.token_hex(20)
    spark_secret = "spark-" + secrets.token_hex(20)
    conf_dir = scratch / "secrets-conf"
    conf_dir.mkdir()
    conf_file = conf_dir / "spark-defaults.conf"
    conf_file.write_text(
        f"spark.arrowbeat.authenticate.secret {secret}\n"
        f"spark.authenticate true\nspark.authenticate.secret {spark_secret}\n"
    )
    conf_file.chmod(0o600)
    result = Run(
        secret=secret.encode(),
        spark_secret=spark_secret.encode(),
        conf_file=conf_file,
        tables=scratch / "secrets-tables",
        shuffle_root=scratch / "secrets-shuffle",
    )
    go = scratch / "secrets-go"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPARK_CONF_DIR", str(conf_dir))
        app = SubmittedApp(
            HOLD_APP,
            "local-cluster[2,1,1024]",
            scratch,
            conf={
                "spark.arrowbeat.log.level": "debug",
                "spark.arrowbeat.heartbeat.interval": "500ms",
                "spark.arrowbeat.heartbeat.timeout": "2s",
                "spark.arrowbeat.tables.path": str(result.tables),
                "spark.arrowbeat.tables.flushInterval": "500ms",
                "spark.arrowbeat.shuffle.dir": str(result.shuffle_root),
                "spark.arrowbeat.ssl.enabled": "true",
            },
            args=[str(go), "--shuffle", "--tls-key-out", str(scratch / "secrets-tls-key")],
        )
    try:
        ready = app.wait_for("APP-READY ", timeout_s=240)
        assert ready["rm_address"] and ready["shuffled"] == 20_000, ready
        result.tls_key = (scratch / "secrets-tls-key").read_bytes()
        assert len(result.tls_key) > 64, "TLS is on: the driver-side process generated a key"
        assert wait_until(
            lambda: {e for e, k in events(result.tables) if k == "REGISTERED"} >= {"0", "1"}, 60
        )
        assert wait_until(lambda: len(rows(result.tables, "heartbeats")) > 4, 60)
        snapshot_processes(result, app.marker)
        result.shuffle_files_while_running = files_under(result.shuffle_root)

        executors = {
            p.cmdline()[p.cmdline().index("--executor-id") + 1]: p
            for p in ours("CoarseGrainedExecutorBackend", app.marker)
        }
        executors["1"].send_signal(signal.SIGKILL)
        assert wait_until(lambda: ("1", "UNREGISTERED") in events(result.tables), GENEROUS_S), events(
            result.tables
        )
        assert wait_until(
            lambda: len({e for e, k in events(result.tables) if k == "REGISTERED"}) >= 3, 3 * GENEROUS_S
        ), events(result.tables)
        snapshot_processes(result, app.marker)

        go.touch()
        assert app.wait_for("APP-RESULT ", timeout_s=240)["shuffled"] == 20_000
        result.exit_code = app.wait(timeout_s=120)
        result.stdout = "\n".join(app.stdout_lines()).encode()
        result.log = app.log_path.read_bytes()
        yield result
    finally:
        app.close()


def test_the_scan_can_find_the_secret(run: Run) -> None:
    """The searches below look at bytes as written: the one file that holds the secret on
    purpose (the configuration) is found by the same search."""
    assert holding(files_under(run.conf_file.parent), run.secret) == [str(run.conf_file)]
    assert run.exit_code == 0


def test_no_log_holds_the_secret(run: Run) -> None:
    """The driver's log (spark-submit's stderr and stdout) and every executor's stdout/stderr
    under SPARK_WORKER_DIR, with arrowbeat's processes logging at debug level."""
    app_id = rows(run.tables, "executor_events")[0]["app_id"]
    worker_files = files_under(executor_dirs(app_id))
    executor_logs = {k: v for k, v in worker_files.items() if Path(k).name in ("stderr", "stdout")}
    # The logs hold what they should: the driver-side process's and the agents' debug lines.
    assert b"[arrowbeat driver]" in run.log and b" DEBUG " in run.log, run.log[-2000:]
    assert any(b"[arrowbeat agent-" in data and b" DEBUG " in data for data in executor_logs.values())
    assert leaks(run, {"driver log": run.log, "driver stdout": run.stdout, **worker_files}) == {}


def test_no_history_table_file_holds_the_secret(run: Run) -> None:
    tables = files_under(run.tables)
    assert {"1"} <= {
        r["executor_id"] for r in rows(run.tables, "executor_events") if r["event"] == "UNREGISTERED"
    }
    assert any("/executor_events/" in name and name.endswith(".parquet") for name in tables)
    assert any("/heartbeats/" in name for name in tables)
    assert leaks(run, tables) == {}


def test_no_shuffle_file_holds_the_secret(run: Run) -> None:
    assert run.shuffle_files_while_running, "the shuffle root held no file while the application ran"
    assert leaks(run, run.shuffle_files_while_running) == {}
    assert leaks(run, files_under(run.shuffle_root)) == {}


def test_no_process_argv_or_environment_holds_the_secret(run: Run) -> None:
    """The driver-side process and every agent (the replacement's included), and every other
    process of the application: JVMs, Python driver, Python workers."""
    assert len(run.arrowbeat_pids) >= 4, "expected the driver-side process and three agents"
    roles = {name.split()[1] for name in run.proc_files}
    assert set(ROLES) <= roles, roles
    assert leaks(run, run.proc_files) == {}


def test_arrowbeat_processes_do_not_inherit_sparks_secret(run: Run) -> None:
    """Spark puts its own secret in each executor JVM's environment; the launcher leaves every
    variable naming a secret or password out of its children's."""
    executor_envs = {
        k: v for k, v in run.proc_files.items() if "CoarseGrained" in k and k.endswith("environ")
    }
    assert any(run.spark_secret in env for env in executor_envs.values()), (
        "Spark did not hand its secret over"
    )
    agents = {k: v for k, v in run.proc_files.items() if int(k.split()[0]) in run.arrowbeat_pids}
    assert holding(agents, run.spark_secret) == []
    assert holding(agents, b"_SPARK_AUTH_SECRET") == []
