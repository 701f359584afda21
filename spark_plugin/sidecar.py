"""The Python end of the JVM launcher's protocol (``launcher/.../Sidecar.java``).

The hosting JVM (driver or executor) starts this process with a pipe on stdin and:

1. writes the settings as ``key<TAB>value`` lines closed by an empty line (secrets never go
   through argv or the environment, which ``ps`` and ``/proc`` show);
2. waits for one line ``ARROWBEAT-READY k=v ...`` on the protocol channel
   (:meth:`JvmChannel.announce_ready`);
3. writes a pulse line ``p <running_tasks>`` every pulse interval. A pulse proves the JVM itself
   runs: a SIGSTOPped or GC-frozen JVM stops pulsing although this process still would answer;
   the driver (and the driver's own executor in local mode, which starts before it) also sends
   ``app <application id>`` once Spark has assigned one;
4. writes ``stop`` and closes the pipe to stop us. The kernel closes it too when the JVM dies, even
   by SIGKILL, so EOF is our only exit signal and no orphan survives its JVM; EOF without ``stop``
   means the JVM died.

Back to the JVM go two channels that never mix. The **protocol channel** is the process's
original stdout, which :meth:`JvmChannel.claim_stdout` moves to a private descriptor first thing
at start-up (descriptor 1 then points at stderr, so a stray ``print`` or a library writing to
stdout lands in the log): it carries the ready line and validated commands only
(:meth:`JvmChannel.kill_executor`). The **log** is stderr (:func:`setup_logging`), which the
JVM copies to its own log and never reads for commands, so a log line that looks like a command
(a reason from the wire, say) is only ever logged. The JVM validates every protocol line again.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Iterable, Mapping
from typing import BinaryIO

from heartbeat.clock import SYSTEM_CLOCK, Clock
from spark_plugin.errors import JvmCommandError, MalformedSettingsError, SettingsTruncatedError

READY = "ARROWBEAT-READY"
COMMAND = "ARROWBEAT-CMD"
KILL_EXECUTOR = "kill-executor"
OUTPUTS_LOST = "outputs-lost"
LOST_REASON = re.compile(r"[a-z][a-z-]{0,31}")
"""What ``outputs-lost`` may carry (``Command.REASON`` on the JVM side)."""
EXECUTOR_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""An executor id the JVM accepts in ``kill-executor`` (``launcher/.../Command.java``)."""
_READY_KEY = re.compile(r"[a-z_]{1,32}")
_READY_VALUE = re.compile(r"[!-~]{1,256}")
_READY_BASE64 = re.compile(r"[A-Za-z0-9+/=]{1,1024}")
_READY_BASE64_KEYS = frozenset({"ssl_cert", "ssl_key_secret"})
"""Ready fields that carry DER as base64 (``tls.ready_fields``): longer values, a narrower set."""
_SECRET_KEY = re.compile(r"secret|password|token|access[.]?key", re.IGNORECASE)
"""Setting keys whose values are secrets: Spark's default ``spark.redaction.regex``."""
REDACTED = "<redacted>"
log = logging.getLogger("arrowbeat.sidecar")


def _unescape(text: str) -> str:
    out: list[str] = []
    chars = iter(text)
    for ch in chars:
        if ch != "\\":
            out.append(ch)
            continue
        nxt = next(chars, "")
        out.append({"n": "\n", "t": "\t", "\\": "\\"}.get(nxt, nxt))
    return "".join(out)


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
        self.gone = threading.Event()
        self.app_assigned = threading.Event()
        """Set once the JVM sent ``app <application id>``."""
        self._thread: threading.Thread | None = None

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
            key, sep, value = line.partition("\t")
            if not sep:
                # Not the line itself: it may be a secret's value.
                raise MalformedSettingsError(
                    f"malformed settings line {number} from the JVM ({len(line)} characters, no tab)"
                )
            settings[_unescape(key)] = _unescape(value)

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
            self.gone.set()

    def _on_pulse(self, line: str) -> None:
        parts = line.split()
        if parts == ["stop"]:
            self.stop_requested.set()
            return
        if len(parts) == 2 and parts[0] == "app":
            with self._lock:
                self._app_id = parts[1]
            self.app_assigned.set()
        running = None
        if len(parts) == 2 and parts[0] == "p" and parts[1].isdigit():
            running = int(parts[1])
        with self._lock:
            self._last_pulse = self._clock.monotonic()
            if running is not None:
                self._running_tasks = running

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
        """``ARROWBEAT-READY k=v ...``: keys ``[a-z_]``, values visible ASCII without spaces."""
        fields = []
        for key, value in info.items():
            text = str(value)
            pattern = _READY_BASE64 if key in _READY_BASE64_KEYS else _READY_VALUE
            if not _READY_KEY.fullmatch(key) or not pattern.fullmatch(text):
                raise JvmCommandError(f"ready field {key!r} is not key=value of the protocol's form")
            fields.append(f"{key}={text}")
        self._write(f"{READY} {' '.join(fields)}")

    def kill_executor(self, executor_id: str) -> None:
        """Asks the JVM DriverPlugin to have Spark kill and replace the executor; an id the JVM
        would refuse raises :class:`JvmCommandError` and nothing is written."""
        if not EXECUTOR_ID.fullmatch(executor_id) or executor_id == "driver":
            raise JvmCommandError(f"no kill-executor for executor id {executor_id[:40]!r}: not a Spark id")
        self._write(f"{COMMAND} {KILL_EXECUTOR} {executor_id}")

    def outputs_lost(self, reason: str) -> None:
        """Tells the JVM ExecutorPlugin that this executor's map outputs are gone (files vanished),
        so that Spark replaces the executor and recomputes its map partitions. An agent may give
        no other command."""
        if not LOST_REASON.fullmatch(reason):
            raise JvmCommandError(f"no outputs-lost with reason {reason[:40]!r}: expected [a-z-]")
        self._write(f"{COMMAND} {OUTPUTS_LOST} {reason}")

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


def exit_process(code: int) -> None:
    """Ends the process without interpreter finalisation, which would trip over the daemon thread
    still blocked reading stdin. Call after every resource is closed."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def wait_for_exit(link: JvmLink) -> str:
    """Blocks until the JVM is gone or we get SIGTERM/SIGINT; returns which."""
    reason: list[str] = []

    def on_signal(signum: int, _frame: object) -> None:
        reason.append(signal.Signals(signum).name)
        link.gone.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    link.gone.wait()
    if reason:
        return reason[0]
    return "stopped by the JVM" if link.stop_requested.is_set() else "the JVM exited unexpectedly"
