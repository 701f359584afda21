"""The Python end of the JVM launcher's protocol (``launcher/.../Sidecar.java``).

The hosting JVM (driver or executor) starts this process with a pipe on stdin and:

1. writes the settings as ``key<TAB>value`` lines closed by an empty line (secrets never go
   through argv or the environment, which ``ps`` and ``/proc`` show);
2. waits for one stdout line ``ARROWBEAT-READY k=v ...`` (:func:`announce_ready`);
3. writes a pulse line ``p <running_tasks>`` every pulse interval. A pulse proves the JVM itself
   runs: a SIGSTOPped or GC-frozen JVM stops pulsing although this process still would answer;
   the driver (and the driver's own executor in local mode, which starts before it) also sends
   ``app <application id>`` once Spark has assigned one;
4. writes ``stop`` and closes the pipe to stop us. The kernel closes it too when the JVM dies, even
   by SIGKILL, so EOF is our only exit signal and no orphan survives its JVM; EOF without ``stop``
   means the JVM died.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from typing import BinaryIO

from heartbeat.clock import SYSTEM_CLOCK, Clock
from spark_plugin.errors import MalformedSettingsError, SettingsTruncatedError

READY = "ARROWBEAT-READY"
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
        while True:
            raw = self._stream.readline()
            if not raw:
                raise SettingsTruncatedError("the JVM closed stdin before sending all settings")
            line = raw.decode("utf-8").rstrip("\n")
            if not line:
                return settings
            key, sep, value = line.partition("\t")
            if not sep:
                raise MalformedSettingsError(f"malformed settings line from the JVM: {line[:80]!r}")
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


def announce_ready(**info: object) -> None:
    """Tells the JVM we are up: one ``ARROWBEAT-READY k=v ...`` line (values without spaces)."""
    fields = " ".join(f"{k}={v}" for k, v in info.items())
    sys.stdout.write(f"{READY} {fields}\n")
    sys.stdout.flush()


def setup_logging(level: str) -> None:
    """Logs go to stderr, which the JVM merges into its own log, prefixed with our role."""
    logging.basicConfig(
        stream=sys.stderr,
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


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
