"""The worker-side shims (``spark_plugin.compat``), without a JVM: fake ``pyspark.worker`` modules
with each minor's hook shape (one argument up to 4.2, two in 4.3), a missing hook and unknown
versions; the daemon's entry and fork plan; arrowbeat's stack signal beside what Spark arms
(``faulthandler.enable``, ``dump_traceback_later``); and arrowbeat's daemon started for real on
this cell's pyspark, once as it is and once passed off as an unknown minor."""

from __future__ import annotations

import inspect
import logging
import os
import struct
import subprocess
import sys
import textwrap
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spark_plugin.compat import daemon as daemon_compat
from spark_plugin.compat.worker_hooks import find_task_start_hook, on_task_start

ROOT = Path(__file__).parents[2]

ONE_ARGUMENT = """
calls = []

def setup_spark_files(infile):
    calls.append(infile)
    return "files of " + str(infile)

def main(infile, outfile):
    return setup_spark_files(infile)
"""
"""The shape of pyspark 4.0-4.2's worker: ``main`` calls ``setup_spark_files(infile)``."""

TWO_ARGUMENTS = """
calls = []

def setup_spark_files(infile_or_spark_files_dir, python_includes=None):
    calls.append((infile_or_spark_files_dir, python_includes))
    return {"dir": infile_or_spark_files_dir, "includes": python_includes}

def invoke_udf(init, outfile):
    return setup_spark_files(init["dir"], init["includes"])

def main(infile, outfile):
    return invoke_udf(infile, outfile)
"""
"""The shape of pyspark 4.3's worker: ``invoke_udf`` calls ``setup_spark_files(dir, includes)``."""

NO_HOOK = """
def main(infile, outfile):
    return None
"""


def fake_worker(source: str) -> Any:
    module = types.ModuleType("fake_pyspark_worker")
    exec(compile(source, "<fake pyspark.worker>", "exec"), module.__dict__)
    return module


class FakeTask:
    def __init__(self, attempt: int) -> None:
        self._attempt = attempt

    def taskAttemptId(self) -> int:
        return self._attempt


class FakeTaskContext:
    """``TaskContext``'s class-level ``get()`` and the task's ``taskAttemptId()``."""

    current: FakeTask | None = None

    @classmethod
    def get(cls) -> FakeTask | None:
        return cls.current

    def taskAttemptId(self) -> int:
        return -1


@pytest.fixture
def task_context() -> Iterator[type[FakeTaskContext]]:
    FakeTaskContext.current = FakeTask(41)
    yield FakeTaskContext
    FakeTaskContext.current = None


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


# -- the task-start hook ------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["4.0.5", "4.1.4", "4.2.1"])
def test_the_one_argument_hook_labels_and_passes_everything_through(
    version: str, task_context: type[FakeTaskContext], caplog: pytest.LogCaptureFixture
) -> None:
    worker = fake_worker(ONE_ARGUMENT)
    original = worker.setup_spark_files
    seen: list[int] = []
    assert on_task_start([seen.append], worker, task_context, version)
    assert warnings_of(caplog) == []
    assert worker.setup_spark_files is not original
    assert worker.main("sock", "out") == "files of sock"  # the task loop reaches the wrapper by name
    assert worker.setup_spark_files(infile="kw") == "files of kw"
    assert worker.calls == ["sock", "kw"] and seen == [41, 41]


def test_the_two_argument_hook_of_4_3_passes_every_argument_and_the_result_through(
    task_context: type[FakeTaskContext], caplog: pytest.LogCaptureFixture
) -> None:
    worker = fake_worker(TWO_ARGUMENTS)
    seen: list[int] = []
    assert on_task_start([seen.append], worker, task_context, "4.3.0")
    assert warnings_of(caplog) == []
    init = {"dir": "/spark/files", "includes": ["a.zip", "b.egg"]}
    assert worker.main(init, "out") == init
    assert worker.setup_spark_files("/d", python_includes=["c.zip"]) == {"dir": "/d", "includes": ["c.zip"]}
    assert worker.setup_spark_files(infile_or_spark_files_dir="/e") == {"dir": "/e", "includes": None}
    assert worker.calls == [("/spark/files", ["a.zip", "b.egg"]), ("/d", ["c.zip"]), ("/e", None)]
    assert seen == [41, 41, 41]
    assert str(inspect.signature(worker.setup_spark_files)) == (
        "(infile_or_spark_files_dir, python_includes=None)"
    )


@pytest.mark.parametrize(
    ("source", "version", "named"),
    [
        (ONE_ARGUMENT, "4.3.0", "setup_spark_files(infile)"),  # 4.3 with 4.2's signature
        (TWO_ARGUMENTS, "4.0.5", "setup_spark_files(infile_or_spark_files_dir, python_includes=None)"),
        (NO_HOOK, "4.3.0", "has no setup_spark_files"),
        (ONE_ARGUMENT, "4.4.0", "pyspark 4.4.0 is not a version"),
        (TWO_ARGUMENTS, "4.4.0", "pyspark 4.4.0 is not a version"),
        (ONE_ARGUMENT, "3.5.3", "pyspark 3.5.3 is not a version"),
    ],
)
def test_a_changed_missing_or_unknown_hook_is_left_alone_with_one_warning(
    source: str,
    version: str,
    named: str,
    task_context: type[FakeTaskContext],
    caplog: pytest.LogCaptureFixture,
) -> None:
    worker = fake_worker(source)
    before = dict(worker.__dict__)
    seen: list[int] = []
    assert not on_task_start([seen.append], worker, task_context, version)
    assert worker.__dict__ == before  # nothing patched
    warnings = warnings_of(caplog)
    assert len(warnings) == 1 and named in warnings[0], warnings
    assert "PySpark's worker runs unchanged" in warnings[0]
    if source != NO_HOOK:  # the user's task runs as PySpark ships it
        worker.main({"dir": "/d", "includes": []} if source == TWO_ARGUMENTS else "sock", "out")
        assert len(worker.calls) == 1 and seen == []


def test_a_hook_the_task_loop_does_not_call_by_name_is_left_alone(
    task_context: type[FakeTaskContext], caplog: pytest.LogCaptureFixture
) -> None:
    worker = fake_worker(
        ONE_ARGUMENT + "\nfiles = setup_spark_files\ndef main(infile, outfile):\n    return files(infile)\n"
    )
    assert not on_task_start([print], worker, task_context, "4.1.4")
    assert "does not call setup_spark_files by name" in warnings_of(caplog)[0]


def test_without_a_task_or_with_a_failing_callback_the_task_still_runs(
    task_context: type[FakeTaskContext],
) -> None:
    worker = fake_worker(ONE_ARGUMENT)
    seen: list[int] = []

    def broken(_attempt: int) -> None:
        raise RuntimeError("arrowbeat's own bug")

    assert on_task_start([broken, seen.append], worker, task_context, "4.0.5")
    assert worker.main("a", "out") == "files of a" and seen == [41]  # the next callback still ran
    task_context.current = None
    assert worker.main("b", "out") == "files of b" and seen == [41]  # no task: no callback
    assert worker.calls == ["a", "b"]


def test_pysparks_own_errors_pass_through_unchanged(task_context: type[FakeTaskContext]) -> None:
    worker = fake_worker(ONE_ARGUMENT.replace("calls.append(infile)", 'raise EOFError("socket closed")'))
    assert on_task_start([lambda _a: None], worker, task_context, "4.2.1")
    with pytest.raises(EOFError, match="socket closed"):
        worker.main("sock", "out")


def test_a_second_install_adds_callbacks_to_the_one_wrapper(task_context: type[FakeTaskContext]) -> None:
    worker = fake_worker(TWO_ARGUMENTS)
    original = worker.setup_spark_files
    first: list[int] = []
    second: list[int] = []
    assert on_task_start([first.append], worker, task_context, "4.3.0")
    assert on_task_start([second.append], worker, task_context, "4.3.0")
    assert worker.setup_spark_files.__wrapped__ is original  # wrapped once
    worker.main({"dir": "/d", "includes": []}, "out")
    assert first == [41] and second == [41] and len(worker.calls) == 1


def test_this_cells_pyspark_worker_is_one_the_shim_verifies() -> None:
    """The real ``pyspark.worker`` of the running environment (each matrix cell's minor)."""
    hook = find_task_start_hook()
    assert hook.install is not None, hook.reason


# -- the daemon ---------------------------------------------------------------------------------


def test_the_daemon_entry_is_a_manager_that_needs_no_argument() -> None:
    def manager() -> None:
        return None

    def manager_with_port(port: int) -> None:
        return None

    assert daemon_compat.find_daemon_entry(types.SimpleNamespace(manager=manager)).manager is manager
    needs = daemon_compat.find_daemon_entry(types.SimpleNamespace(manager=manager_with_port))
    assert needs.manager is None and "needs arguments" in needs.reason
    missing = daemon_compat.find_daemon_entry(types.SimpleNamespace())
    assert missing.manager is None and "no manager()" in missing.reason


@pytest.mark.parametrize(
    ("version", "imports_at_load", "preload", "freeze_in_worker", "reason"),
    [
        ("4.0.5", True, daemon_compat.FULL_PRELOAD, False, ""),
        ("4.1.4", True, daemon_compat.FULL_PRELOAD, False, ""),
        ("4.2.1", False, daemon_compat.THREAD_FREE_PRELOAD, True, ""),
        ("4.3.0", False, daemon_compat.THREAD_FREE_PRELOAD, True, ""),
        ("4.3.0", True, (), False, "does not import its worker module after fork"),
        ("4.1.4", False, (), False, "does not import its worker module before fork"),
        ("4.4.0", False, (), False, "pyspark 4.4.0 is not a version whose daemon"),
    ],
)
def test_the_fork_plan_follows_the_daemons_own_import_order(
    version: str, imports_at_load: bool, preload: tuple[str, ...], freeze_in_worker: bool, reason: str
) -> None:
    daemon = types.SimpleNamespace(**({"worker_main": print} if imports_at_load else {}))
    plan = daemon_compat.fork_plan(daemon, version)
    assert plan.preload == preload and plan.freeze_in_worker == freeze_in_worker
    assert plan.threads_allowed == (preload == daemon_compat.FULL_PRELOAD)
    assert (reason in plan.reason) if reason else plan.reason == ""
    assert not any(m in ("pyarrow", "pandas") for m in plan.preload if not plan.threads_allowed)


def test_this_cells_pyspark_daemon_is_one_the_shim_verifies() -> None:
    import pyspark.daemon

    assert daemon_compat.find_daemon_entry(pyspark.daemon).manager is pyspark.daemon.manager
    assert daemon_compat.fork_plan(pyspark.daemon).reason == ""


def start_daemon(prelude: str) -> tuple[int, str, bytes]:
    """arrowbeat's daemon on this interpreter: the port it wrote, then (stdin closed: PySpark's
    signal to end) what it wrote to stderr, and anything more on stdout."""
    code = (
        f"{prelude}\nfrom spark_plugin.python_worker import daemon as python_daemon\npython_daemon.main()\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=ROOT,
    )
    assert proc.stdout is not None and proc.stdin is not None and proc.stderr is not None
    try:
        raw = proc.stdout.read(4)
        assert len(raw) == 4, proc.stderr.read().decode()
        port = struct.unpack("!i", raw)[0]
        proc.stdin.close()
        rest = proc.stdout.read()
        err = proc.stderr.read().decode()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    return port, err, rest


def test_the_daemon_starts_silently_on_this_cells_pyspark() -> None:
    port, err, rest = start_daemon("")
    assert 0 < port < 65536 and rest == b""
    assert "arrowbeat" not in err, err


def test_on_an_unknown_pyspark_the_daemon_still_serves_and_says_why_once_per_concern() -> None:
    port, err, rest = start_daemon("import pyspark\npyspark.__version__ = '4.4.0'")
    assert 0 < port < 65536 and rest == b""  # stdout carries the port only: PySpark reads it
    warnings = [line for line in err.splitlines() if line.startswith("arrowbeat worker daemon: WARNING")]
    assert len(warnings) == 2, err
    assert "preloads nothing: pyspark 4.4.0 is not a version whose daemon" in warnings[0]
    assert "hook the start of tasks" in warnings[1] and "pyspark 4.4.0" in warnings[1]


PRELOAD = textwrap.dedent(
    """
    import sys
    from spark_plugin.python_worker.daemon import preload_and_freeze
    sys.path.insert(0, sys.argv[1])
    loaded = preload_and_freeze(["json", "starts_thread", "after_it"], threads_allowed=sys.argv[2] == "yes")
    print(",".join(loaded), "after_it" in sys.modules)
    """
)


@pytest.mark.parametrize("threads_allowed", [False, True])
def test_preloading_stops_at_the_first_import_that_starts_a_thread_where_pyspark_forks_without(
    tmp_path: Path, threads_allowed: bool
) -> None:
    (tmp_path / "starts_thread.py").write_text(
        "import threading\nthreading.Thread(target=threading.Event().wait, daemon=True).start()\n"
    )
    (tmp_path / "after_it.py").write_text("")
    out = subprocess.run(
        [sys.executable, "-c", PRELOAD, str(tmp_path), "yes" if threads_allowed else "no"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    if threads_allowed:  # pyspark 4.0 and 4.1 fork with threads themselves
        assert out.stdout.split() == ["json,starts_thread,after_it", "True"] and out.stderr == ""
    else:
        assert out.stdout.split() == ["json,starts_thread", "False"]
        warnings = [line for line in out.stderr.splitlines() if "stops preloading" in line]
        assert len(warnings) == 1 and "starts_thread started a thread" in warnings[0], out.stderr


def test_the_daemon_freezes_what_a_worker_imported_itself_at_its_second_task() -> None:
    code = textwrap.dedent(
        """
        import gc
        from spark_plugin.python_worker.daemon import freeze_at_second_task
        on_task = freeze_at_second_task()
        gc.collect()
        before = gc.get_freeze_count()
        on_task(1)
        after_first = gc.get_freeze_count()
        on_task(2)
        after_second = gc.get_freeze_count()
        on_task(3)
        print(after_first == before, after_second > after_first, gc.get_freeze_count() == after_second)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.split() == ["True", "True", "True"], out.stderr


# -- arrowbeat's stack signal beside Spark's faulthandler ---------------------------------------

BESIDE_SPARK = textwrap.dedent(
    """
    import faulthandler, os, signal, sys, threading, time
    import arrow_shuffle.private_files  # what label_task imports, before any dump can race it
    local, crash_log, periodic_log = sys.argv[1:4]
    # What Spark arms in a worker: faulthandler on fatal signals into its own file
    # (spark.python.worker.faulthandler.enabled), a repeating traceback dump
    # (spark.python.worker.tracebackDumpIntervalSeconds; a file here instead of stderr). The
    # dump reads this thread's frames from its own thread without the GIL, which can crash
    # CPython <= 3.12 while this thread runs Python code (gh-140815): it starts 0.5 s later,
    # when this thread waits.
    crash = open(crash_log, "w")
    periodic = open(periodic_log, "w")
    faulthandler.enable(file=crash)
    faulthandler.dump_traceback_later(0.5, repeat=True, file=periodic)
    theirs = []
    if sys.argv[4] == "with-handler":  # someone else's SIGUSR2 handler, installed first
        signal.signal(signal.SIGUSR2, lambda signum, frame: theirs.append(signum))
    os.environ["SPARK_LOCAL_DIRS"] = local
    from spark_plugin.python_worker.worker_label import label_task, stack_path

    def blocked_udf():
        label_task(5)
        os.kill(os.getpid(), signal.SIGUSR2)
        stack = stack_path(local, os.getpid())
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (
            os.path.getsize(stack) and os.path.getsize(periodic_log)
            and (theirs or sys.argv[4] != "with-handler")
        ):
            threading.Event().wait(0.05)
        print(open("/proc/self/comm").read().strip(), "blocked_udf" in open(stack).read(),
              faulthandler.is_enabled(), os.path.getsize(periodic_log) > 0, theirs == [signal.SIGUSR2])
        # The end of a task in Spark 4.1: its faulthandler disabled, its dumps cancelled. The
        # worker is reused: arrowbeat's handler (registered once per worker) must still answer.
        faulthandler.disable()
        faulthandler.cancel_dump_traceback_later()
        size = os.path.getsize(stack)
        os.kill(os.getpid(), signal.SIGUSR2)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and os.path.getsize(stack) <= size:
            threading.Event().wait(0.05)
        print(os.path.getsize(stack) > size)

    blocked_udf()
    """
)


@pytest.mark.parametrize("other_handler", [False, True])
def test_the_stack_signal_leaves_what_spark_armed_armed_and_chains_to_a_handler_before_it(
    tmp_path: Path, other_handler: bool
) -> None:
    local = tmp_path / "local"
    local.mkdir()
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            BESIDE_SPARK,
            str(local),
            str(tmp_path / "crash.log"),
            str(tmp_path / "periodic.log"),
            "with-handler" if other_handler else "alone",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        timeout=60,
    )
    assert out.returncode == 0, out.stderr  # SIGUSR2 did not end the worker
    label, stack_named, spark_faulthandler, spark_dumps, theirs_ran, after_spark_stops = out.stdout.split()
    assert label == "abt5" and stack_named == "True" and after_spark_stops == "True"
    assert spark_faulthandler == "True" and spark_dumps == "True"  # Spark's tools still armed
    assert theirs_ran == str(other_handler)
    assert "blocked_udf" in (tmp_path / "periodic.log").read_text()
