"""The Python end of the JVM launcher's link (``launcher/.../Sidecar.java``): our stdin and stdout.

The hosting JVM (driver or executor) starts this process with a pipe on stdin and:

1. writes the settings as ``key<TAB>value`` lines closed by an empty line (secrets never go
   through argv or the environment, which ``ps`` and ``/proc`` show); among them, one
   ``arrowbeat.jvm.unavailable.<name>`` per Spark internal the launcher could not use on this
   Spark (:func:`unavailable_internals`);
2. waits for one line ``ARROWBEAT-READY k=v ...`` on the protocol channel
   (:meth:`JvmChannel.announce_ready`);
3. writes a pulse line ``p <running_tasks>`` every pulse interval. A pulse proves the JVM itself
   runs: a SIGSTOPped or GC-frozen JVM stops pulsing although this process still would answer;
   the driver (and the driver's own executor in local mode, which starts before it) also sends
   ``app <application id>`` once Spark has assigned one, an agent ``rm <host:port>`` when its RM
   was restarted on another port (:meth:`JvmLink.on_rm_address`), and the driver Spark's own view of its
   executors, ``executor-...`` lines (``spark_plugin.monitoring.driver_spark_view``), handed to
   :meth:`JvmLink.on_executor_lines`;
4. writes ``stop`` and closes the pipe to stop us. The kernel closes it too when the JVM dies, even
   by SIGKILL, so EOF is our only exit signal and no orphan survives its JVM. A JVM shutting down
   (SIGTERM or ``System.exit``, as when a cluster manager ends an executor it released) writes
   ``exiting`` first; EOF without ``stop`` or ``exiting`` means the JVM died (SIGKILL, a crash).

Back to the JVM go two channels that never mix. The **protocol channel** is the process's
original stdout, which :meth:`JvmChannel.claim_stdout` moves to a private descriptor first thing
at start-up (descriptor 1 then points at stderr, so a stray ``print`` or a library writing to
stdout lands in the log): it carries the ready line and validated commands only
(:meth:`JvmChannel.kill_executor`), and once per heartbeat interval the figures for Spark's metrics
system (:meth:`JvmChannel.metrics`); both processes also answer each pulse
(:meth:`JvmChannel.alive`, from their serving loop: :class:`PulseAnswers`), and the JVM kills
and restarts one whose answers stop. The **log** is
stderr (:func:`setup_logging`), which the JVM copies to its own log and never reads for
commands, so a log line that looks like a command (a reason from the wire, say) is only ever
logged. The JVM validates every protocol line again.
Every line's format is declared in :mod:`spark_plugin.jvm.protocol`; this module does the I/O.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import BinaryIO

from arrowbeat_base.clock import SYSTEM_CLOCK, Clock
from spark_plugin.errors import MalformedSettingsError, SettingsTruncatedError
from spark_plugin.jvm import protocol
from spark_plugin.jvm.protocol import EXECUTOR_LINES, EXITING, STOP, TASK_LINES, AppAssigned, Pulse, RmMoved

JVM_UNAVAILABLE = "arrowbeat.jvm.unavailable."
"""Settings key prefix: a Spark internal the launcher could not use (``SparkInternals.SETTING_PREFIX``)."""
_SECRET_KEY = re.compile(r"secret|password|token|access[.]?key|account[.]key", re.IGNORECASE)
"""Setting keys whose values are secrets: Spark's default ``spark.redaction.regex``, and the ABFS
account key (``spark.hadoop.fs.azure.account.key.<account>...``), which that regex misses."""
REDACTED = "<redacted>"
log = logging.getLogger("arrowbeat.sidecar")


def unavailable_internals(settings: Mapping[str, str]) -> dict[str, str]:
    """The Spark internals the hosting JVM found unavailable on this Spark, name to why (the
    launcher's ``compat/SparkInternals.java``, which logged each once with what arrowbeat does
    without it): ``executor-local-dirs`` and ``executor-host`` for an agent,
    ``kill-and-replace-executor`` for the driver-side process. Empty on every supported Spark."""
    return {k[len(JVM_UNAVAILABLE) :]: v for k, v in settings.items() if k.startswith(JVM_UNAVAILABLE)}


class JvmLink:
    """Settings, pulses and end-of-life of the hosting JVM, read from our stdin.

    Pulse ages are measured on ``clock.monotonic()``, so tests move a ``ManualClock``."""

    def __init__(self, stream: BinaryIO, clock: Clock = SYSTEM_CLOCK) -> None:
        self._stream = stream
        self._clock = clock
        self._lock = threading.Lock()
        self._last_pulse = clock.monotonic()
        self._running_tasks = 0
        self._app_id = ""
        self.stop_requested = threading.Event()
        self.jvm_exiting = threading.Event()
        """Set once the JVM said it is shutting down (its shutdown hook ran)."""
        self.gone = threading.Event()
        self._said_or_ended = threading.Event()
        """Set by ``stop``, ``exiting`` or EOF: the JVM has said how it ends, or can say no more."""
        self.app_assigned = threading.Event()
        """Set once the JVM sent ``app <application id>``."""
        self._thread: threading.Thread | None = None
        self._executor_lines: Callable[[str], None] | None = None
        self._task_lines: Callable[[str], None] | None = None
        self._pulses: Callable[[], None] | None = None
        self._rm_address: Callable[[str], None] | None = None

    def on_executor_lines(self, handler: Callable[[str], None]) -> None:
        """``executor-...`` lines (Spark's view of its executors) go to ``handler``, on the link's
        thread, in order; without a handler they are dropped. Set it before :meth:`start`."""
        self._executor_lines = handler

    def on_task_lines(self, handler: Callable[[str], None]) -> None:
        """``tasks ...`` and ``stack ...`` lines (the executor JVM's ``TaskWatch``) go to ``handler``,
        on the link's thread, in order; they count as pulses too. Set it before :meth:`start`."""
        self._task_lines = handler

    def on_pulse(self, handler: Callable[[], None]) -> None:
        """``handler()`` runs on the link's thread after each pulse line: the process answers it
        (:meth:`JvmChannel.alive`, through :class:`PulseAnswers`), which is how the JVM tells a
        hung process from a live one. It must not block. Set it before :meth:`start`."""
        self._pulses = handler

    def on_rm_address(self, handler: Callable[[str], None]) -> None:
        """``rm <host:port>`` lines (the RM moved; the address already checked) go to ``handler``,
        on the link's thread. Set it before :meth:`start`."""
        self._rm_address = handler

    def read_settings(self) -> dict[str, str]:
        """Reads the settings block; raises :class:`SettingsTruncatedError` (an ``EOFError``) if the
        JVM closed the pipe before its end, :class:`MalformedSettingsError` for a line without a tab."""
        settings: dict[str, str] = {}
        number = 0
        while True:
            raw = self._stream.readline()
            number += 1
            if not raw:
                raise SettingsTruncatedError("the JVM closed stdin before sending all settings")
            line = raw.decode("utf-8").rstrip("\n")
            if not line:
                return settings
            setting = protocol.parse_setting(line)
            if setting is None:
                # Not the line itself: it may be a secret's value.
                raise MalformedSettingsError(
                    f"malformed settings line {number} from the JVM ({len(line)} characters, no tab)"
                )
            settings[setting[0]] = setting[1]

    def start(self) -> None:
        """Follows pulses on a daemon thread until EOF, which sets :attr:`gone`."""
        with self._lock:
            self._last_pulse = self._clock.monotonic()
        self._thread = threading.Thread(target=self._follow, name="jvm-link", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        try:
            for raw in iter(self._stream.readline, b""):
                self._on_pulse(raw.decode("utf-8", "replace").strip())
        except (OSError, ValueError) as exc:
            log.debug("stdin from the JVM broke: %s", exc)
        finally:
            self._said_or_ended.set()
            self.gone.set()

    def _on_pulse(self, line: str) -> None:
        if line.startswith(EXECUTOR_LINES):
            handler = self._executor_lines
            if handler is not None:
                try:
                    handler(line)
                except Exception:  # one bad line must not end the link (EOF is our exit signal)
                    log.exception("a Spark-view line from the JVM could not be applied")
            return
        if line.startswith(TASK_LINES):
            task_handler = self._task_lines
            if task_handler is not None:
                try:
                    task_handler(line)
                except Exception:  # as above: the link must outlive one bad line
                    log.exception("a task line from the JVM could not be applied")
        parsed = protocol.parse_link_line(line)
        if parsed == STOP:
            self.stop_requested.set()
            self._said_or_ended.set()
            return
        if parsed == EXITING:
            self.jvm_exiting.set()
            self._said_or_ended.set()
            return
        if isinstance(parsed, AppAssigned):
            with self._lock:
                self._app_id = parsed.app_id
            self.app_assigned.set()
        if isinstance(parsed, RmMoved) and self._rm_address is not None:
            try:
                self._rm_address(parsed.address)
            except Exception:  # as above: the link must outlive a failed handler
                log.exception("the RM's new address from the JVM could not be applied")
        running = parsed.running_tasks if isinstance(parsed, Pulse) else None
        with self._lock:
            self._last_pulse = self._clock.monotonic()
            if running is not None:
                self._running_tasks = running
        pulses = self._pulses
        if running is not None and pulses is not None:
            try:
                pulses()
            except Exception:  # as above: the link must outlive a failed answer
                log.exception("answering the JVM's pulse failed")

    def wait_for_word(self, timeout_s: float) -> bool:
        """Waits up to ``timeout_s`` for the JVM's ``stop`` or ``exiting`` line or for EOF; whether
        one came."""
        return self._said_or_ended.wait(timeout_s)

    def pulse_age_s(self) -> float:
        """Seconds since the JVM last proved it runs."""
        with self._lock:
            return self._clock.monotonic() - self._last_pulse

    def app_id(self, default: str = "") -> str:
        """The Spark application id, once the JVM has told us."""
        with self._lock:
            return self._app_id or default

    def running_tasks(self) -> int:
        """Tasks the executor JVM reported running with its last pulse."""
        with self._lock:
            return self._running_tasks


class JvmChannel:
    """The protocol channel to the JVM: the ready line and commands, validated before they are
    written, one whole line per write under a lock. Nothing else ever writes to it."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    @classmethod
    def claim_stdout(cls) -> JvmChannel:
        """Moves the process's stdout (the JVM's protocol pipe) to a private descriptor, not
        inherited by child processes, and points descriptor 1 at stderr: from now on ``print``,
        ``sys.stdout`` and anything writing to descriptor 1 end up in the log. Call first thing."""
        sys.stdout.flush()
        private = os.dup(1)  # non-inheritable (PEP 446)
        os.dup2(2, 1)
        return cls(os.fdopen(private, "wb", buffering=0))

    def announce_ready(self, **info: object) -> None:
        """``ARROWBEAT-READY k=v ...`` (:func:`protocol.ready_line`)."""
        self._write(protocol.ready_line(info))

    def kill_executor(self, executor_id: str) -> None:
        """Asks the JVM DriverPlugin to have Spark kill and replace the executor; an id the JVM
        would refuse raises :class:`JvmCommandError` and nothing is written. The JVM answers with
        an ``executor-replacement`` line (``protocol.ReplacementOutcome``)."""
        self._write(protocol.command_line(protocol.KILL_EXECUTOR, executor_id))

    def lost_executor(self, executor_id: str) -> None:
        """:meth:`kill_executor` for an executor whose heartbeats timed out: once Spark accepted
        the kill, the JVM also tells Spark's scheduler the executor is lost, so the tasks running
        there are resubmitted now, not when the cluster manager has ended the process (a frozen
        JVM outlives its SIGTERM by the Worker's grace). Same answer as :meth:`kill_executor`."""
        self._write(protocol.command_line(protocol.LOST_EXECUTOR, executor_id))

    def decommission_executor(self, executor_id: str) -> None:
        """Asks the JVM DriverPlugin to have Spark decommission the executor (no new task there,
        its shuffle and cached blocks move, then it is replaced), or where Spark cannot, kill and
        replace it: for an executor slower than its peers where ``spark.decommission.enabled`` is
        on. Same answer as :meth:`kill_executor`."""
        self._write(protocol.command_line(protocol.DECOMMISSION_EXECUTOR, executor_id))

    def outputs_lost(self, reason: str) -> None:
        """Tells the JVM ExecutorPlugin that this executor's map outputs are gone (files vanished),
        so that Spark replaces the executor and recomputes its map partitions. An agent may give
        no other command."""
        self._write(protocol.command_line(protocol.OUTPUTS_LOST, reason))

    def rm_unreachable(self, address: str) -> None:
        """Tells the executor JVM that the RM at ``address`` cannot be reached: it asks the driver
        whether the RM moved and, if so, answers with an ``rm <host:port>`` line
        (:meth:`JvmLink.on_rm_address`)."""
        self._write(protocol.command_line(protocol.RM_UNREACHABLE, address))

    def jstack(self, task_id: int) -> None:
        """Asks the executor JVM for the stack of running task ``task_id``'s thread (its reply is
        a ``stack`` line on stdin, see :meth:`JvmLink.on_task_lines`)."""
        self._write(protocol.command_line(protocol.JSTACK, task_id))

    def kill_task(self, task_id: int) -> None:
        """Asks the driver JVM to have Spark kill task attempt ``task_id`` (Spark runs it again)."""
        self._write(protocol.command_line(protocol.KILL_TASK, task_id))

    def alive(self, complete_until_ms: int, unsaved_rows: int) -> None:
        """An answer to a pulse (:func:`protocol.alive_line`): the process is alive and, from the
        driver-side process, how far its history is complete, for the JVM to hand a restarted
        process (an agent keeps no history and answers ``0 0``)."""
        self._write(protocol.alive_line(complete_until_ms, unsaved_rows))

    def metrics(self, snapshot: int, figures: Mapping[str, float | None], role: str) -> None:
        """One snapshot of figures for the JVM plugin's gauges in Spark's metrics system
        (``spark_plugin.jvm.plugin_metrics``): names the JVM of ``role`` takes, numbers only, split into
        bounded lines; anything else raises :class:`JvmCommandError` and nothing is written."""
        from spark_plugin.jvm.plugin_metrics import encode

        for line in encode(snapshot, figures, role):
            self._write(line)

    def _write(self, line: str) -> None:
        data = f"{line}\n".encode("ascii")
        with self._lock:
            try:
                self._stream.write(data)
            except (OSError, ValueError) as exc:  # the JVM is gone; EOF on stdin follows
                log.debug("the protocol channel to the JVM is closed: %s", exc)

    def close(self) -> None:
        with self._lock:
            self._stream.close()


class PulseAnswers:
    """Answers each of the JVM's pulses (:meth:`JvmLink.on_pulse`, on the link's thread) from the
    loop whose life the JVM watches, never from the link's thread: ``when_serving`` runs a callback
    on that loop (``ResourceManagerServer.when_serving`` in the driver-side process, with a
    ``GapBook``'s figures as ``answer()``; ``AgentThread.when_serving`` in an agent, which answers
    ``(0, 0)``: it keeps no history). A wedged loop sends nothing, and the JVM calls the process
    hung (``Supervision.java``) and kills it. At most one answer is pending, so a wedged loop does
    not pile them up."""

    def __init__(
        self,
        when_serving: Callable[[Callable[[], None]], None],
        answer: Callable[[], tuple[int, int]],
        send: Callable[[int, int], None],
    ) -> None:
        self._when_serving = when_serving
        self._answer = answer
        self._send = send
        self._lock = threading.Lock()
        self._pending = False

    def __call__(self) -> None:
        with self._lock:
            if self._pending:
                return
            self._pending = True
        try:
            self._when_serving(self._reply)
        except Exception:
            with self._lock:
                self._pending = False
            raise

    def _reply(self) -> None:
        with self._lock:
            self._pending = False
        self._send(*self._answer())


class _Redacting(logging.Formatter):
    """Formats as usual, then replaces every secret: no log line of ours carries one, whatever
    an exception message or a third-party library put in it."""

    def __init__(self, fmt: str, secrets: Iterable[str]) -> None:
        super().__init__(fmt)
        self._secrets = [s for s in secrets if s]

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        for secret in self._secrets:
            text = text.replace(secret, REDACTED)
        return text


def secret_values(settings: Mapping[str, str]) -> list[str]:
    """The values of settings whose keys name a secret (at least 6 characters: shorter ones are
    not secrets worth the name and would redact ordinary words)."""
    return [v for k, v in settings.items() if _SECRET_KEY.search(k) and len(v) >= 6]


def setup_logging(level: str, secrets: Iterable[str] = ()) -> None:
    """Logs go to stderr, which the JVM copies into its own log, prefixed with our role; every
    one of ``secrets`` is replaced by ``<redacted>`` in every line."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Redacting("%(asctime)s %(levelname)s %(name)s: %(message)s", secrets))
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), handlers=[handler])


SIGNAL_WORD_GRACE_S = 2.0
"""After SIGTERM or SIGINT, how long we wait for the JVM's own word (``stop`` or ``exiting``) before
the signal names our end. A container's end signals the whole process group, the JVM and us at
once, and the JVM's shutdown hook says so a moment later; the JVM's stop escalates to SIGTERM only
after it said ``stop``, which a loaded machine may not have let us read yet. A signal the JVM
says nothing about (an operator's ``kill``; the JVM lives on) ends us this much later."""


def wait_for_exit(link: JvmLink, word_grace_s: float = SIGNAL_WORD_GRACE_S) -> str:
    """Blocks until the JVM is gone or we get SIGTERM/SIGINT; returns why we end. The JVM's word
    wins over a signal: an orderly stop or shutdown is never reported as a bare signal."""
    signalled: list[str] = []

    def on_signal(signum: int, _frame: object) -> None:
        signalled.append(signal.Signals(signum).name)
        link.gone.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    link.gone.wait()
    if signalled:
        link.wait_for_word(word_grace_s)
    if link.stop_requested.is_set():
        return "stopped by the JVM"
    if link.jvm_exiting.is_set():
        return "the JVM shut down (SIGTERM or exit)"
    if signalled:
        return signalled[0]
    return "the JVM exited unexpectedly"
