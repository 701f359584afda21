"""A stand-in interpreter for arrowbeat's processes that writes command-like lines everywhere a log,
a stray print or a bug can put them (``spark.arrowbeat.python`` points to a script that runs
``python noisy_child.py -u -m <module>``).

In the driver-side process, once it logs that executor ``TARGET`` registered (so Spark knows that
executor and would accept a kill), it writes ``ARROWBEAT-CMD kill-executor TARGET`` through
``print()`` (Python's stdout), ``os.write(1, ...)`` (stdout at the descriptor, as a C library
would), ``sys.stderr`` and a log record; then, straight onto its real protocol channel, lines the
JVM must refuse (malformed commands, an unknown verb, an over-long line, a second ready line);
then it logs ``NOISE-DONE``. In each agent, right after its ready line, it writes a well-formed
``kill-executor`` onto the agent's protocol channel, which the JVM must refuse too (agents may
give no command), and prints the same line to stdout.
"""

from __future__ import annotations

import logging
import os
import runpy
import sys
from typing import Any

from spark_plugin.jvm import sidecar

TARGET = "1"
INJECTED = f"ARROWBEAT-CMD kill-executor {TARGET}"
REFUSED_ON_THE_CHANNEL = (
    f"{INJECTED} now",
    "ARROWBEAT-CMD kill-executor ../1",
    "ARROWBEAT-CMD kill-executor driver",
    "ARROWBEAT-CMD  kill-executor 1",
    "ARROWBEAT-CMD reboot",
    "ARROWBEAT-CMD kill-executor " + "1" * 70,
    "x" * 5000,
    "ARROWBEAT-READY address=evil:1",
)
channels: list[Any] = []


def capture_channel() -> None:
    """Keeps the process's protocol channel at hand, to write to it what the code never would."""
    original = sidecar.JvmChannel.claim_stdout.__func__  # type: ignore[attr-defined]

    def claim(cls: type) -> Any:
        channel = original(cls)
        channels.append(channel)
        return channel

    sidecar.JvmChannel.claim_stdout = classmethod(claim)  # type: ignore[method-assign,assignment]


class Noise(logging.Handler):
    """Fires once, on the driver-side process's log line for executor TARGET's registration."""

    def __init__(self) -> None:
        super().__init__()
        self.fired = False

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if self.fired or not message.startswith(f"executor {TARGET} ") or "REGISTERED" not in message:
            return
        self.fired = True
        print(INJECTED, flush=True)
        os.write(1, f"{INJECTED}\n".encode())
        sys.stderr.write(f"{INJECTED}\n")
        sys.stderr.flush()
        logging.getLogger("noisy").warning("a reason from the wire\n%s", INJECTED)
        for line in REFUSED_ON_THE_CHANNEL:
            channels[0]._write(line)
        logging.getLogger("noisy").warning("NOISE-DONE")


def noisy_agent() -> None:
    """After the agent's own ready line: a valid command on its channel, and a stray print."""
    original = sidecar.JvmChannel.announce_ready

    def announce_ready(self: Any, **info: object) -> None:
        original(self, **info)
        self._write(INJECTED)
        print(INJECTED, flush=True)

    sidecar.JvmChannel.announce_ready = announce_ready  # type: ignore[method-assign]


def main() -> None:
    args = sys.argv[1:]
    module = args[args.index("-m") + 1]
    capture_channel()
    if module == "spark_plugin.processes.driver":
        logging.getLogger("arrowbeat.driver").addHandler(Noise())
    else:
        noisy_agent()
    sys.argv = [module]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
