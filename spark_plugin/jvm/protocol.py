"""Every line of the JVM <-> Python protocol, declared once on the Python side.

The JVM side is ``launcher/.../Protocol.java``; ``tests/spark_plugin/test_protocol_contract.py``
runs the two against each other for every line kind (:data:`KINDS`). Encoders validate and raise
:class:`JvmCommandError` rather than write a line the JVM would refuse; parsers return None (or
raise ``ValueError`` where a caller wants the reason) for anything not exactly of the grammar.

To us, on stdin (the JVM writes, we parse):

* the settings block, ``key<TAB>value`` lines closed by an empty line (:func:`unescape_line`);
* ``p <running tasks>`` (a pulse), ``app <application id>``, ``stop``, ``exiting``, and to an
  agent ``rm <host:port>``, where its RM is now (a restarted RM on another port)
  (:func:`parse_link_line`);
* on the driver, Spark's view of its executors (:func:`parse_executor_line`):
  ``executor-added <id> <host>``, ``executor-removed <id> <facts> <reason>``,
  ``executor-unmonitored <id> <reason>``, ``executor-agent-down <id> <pid> <restart in ms>
  <cause>``, ``executor-outputs-lost <id> <reason> <tasks started>``,
  ``executor-replacement <id> accepted|refused|unavailable``;
* on an executor, ``tasks ...`` (:func:`parse_tasks`) and ``stack <task> <escaped text>``
  (:func:`parse_stack`).

From us, on the protocol channel (we encode, the JVM parses): ``ARROWBEAT-READY k=v ...``
(:func:`ready_line`), ``ARROWBEAT-CMD <verb> <argument>`` (:func:`command_line`),
``ARROWBEAT-METRICS <snapshot> name=value ...`` (:func:`metrics_lines`) and
``ARROWBEAT-ALIVE <complete until ms> <unsaved rows>`` (:func:`alive_line`): the answer to a
pulse, which the JVM's hang detector waits for (from an agent, ``0 0``).

Pure: no I/O, no clock; what the lines mean is decided by their readers (``monitoring``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from spark_plugin.errors import JvmCommandError

KINDS = frozenset(
    {
        "settings",
        "pulse",
        "app",
        "stop",
        "exiting",
        "executor-added",
        "executor-removed",
        "executor-unmonitored",
        "executor-agent-down",
        "executor-outputs-lost",
        "executor-replacement",
        "tasks",
        "stack",
        "rm",
        "ready",
        "command",
        "metrics",
        "alive",
    }
)
"""The line kinds between the JVM and us. ``Protocol.KINDS`` adds ``plugin-message``: what an
executor plugin sends the driver plugin over Spark's RPC, an ``executor-outputs-lost``,
``executor-unmonitored`` or ``executor-agent-down`` line that the driver plugin checks again and
relays to us."""

EXECUTOR_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""An executor id as Spark forms it (``Protocol.EXECUTOR_ID``)."""
REASON = re.compile(r"[a-z][a-z-]{0,31}")
"""A reason token (``Protocol.REASON``): lost outputs, an agent that did not start."""
HOST = re.compile(r"[A-Za-z0-9._:%\[\]-]{1,253}")
MAX_TASK_ID = 10**18


def is_executor(executor_id: str) -> bool:
    """An id of Spark's form, other than the driver's: the only ones the JVM kills."""
    return bool(EXECUTOR_ID.fullmatch(executor_id)) and executor_id != "driver"


# -- to us: the link lines ---------------------------------------------------------------------


def unescape_line(text: str) -> str:
    """The JVM's ``Protocol.escape`` undone: ``\\n``, ``\\t`` and ``\\\\``."""
    out: list[str] = []
    chars = iter(text)
    for ch in chars:
        if ch != "\\":
            out.append(ch)
            continue
        nxt = next(chars, "")
        out.append({"n": "\n", "t": "\t", "\\": "\\"}.get(nxt, nxt))
    return "".join(out)


def parse_setting(line: str) -> tuple[str, str] | None:
    """One ``key<TAB>value`` line of the settings block, unescaped; None if it has no tab."""
    key, sep, value = line.partition("\t")
    return (unescape_line(key), unescape_line(value)) if sep else None


@dataclass(frozen=True, slots=True)
class Pulse:
    running_tasks: int


@dataclass(frozen=True, slots=True)
class AppAssigned:
    app_id: str


@dataclass(frozen=True, slots=True)
class RmMoved:
    """The RM is at ``address`` now: it was restarted and could not bind its port again."""

    address: str


ADDRESS = re.compile(r"[A-Za-z0-9.\-\[\]:]{1,253}:[0-9]{1,5}")
"""``host:port`` of the RM as the JVM passes it on (``Protocol.ADDRESS``)."""
STOP, EXITING = "stop", "exiting"
LinkLine = Pulse | AppAssigned | RmMoved | str
NOT_STARTED = 2
"""Exit status of a driver-side process or an agent that refused its settings: the JVM does not
retry its start (``Supervision.retriesStart``), since the same settings fail again; any other
failed start (a missed start-up timeout, a crash) is retried, rate-limited."""


def parse_link_line(line: str) -> LinkLine | None:
    """A pulse, the application id, the RM's new address, :data:`STOP` or :data:`EXITING`; None
    for anything else."""
    parts = line.split()
    if parts in ([STOP], [EXITING]):
        return parts[0]
    if len(parts) == 2 and parts[0] == "app":
        return AppAssigned(parts[1])
    if len(parts) == 2 and parts[0] == "rm" and ADDRESS.fullmatch(parts[1]):
        return RmMoved(parts[1])
    if len(parts) == 2 and parts[0] == "p" and parts[1].isdigit():
        return Pulse(int(parts[1]))
    return None


# -- to us: Spark's view of its executors (the driver) -----------------------------------------

EXECUTOR_LINES = "executor-"
MAX_EXECUTOR_LINE_CHARS = 1024
"""A longer line is not the JVM's (it cuts Spark's reason to 400 characters)."""
ADDED, REMOVED, UNMONITORED = "executor-added", "executor-removed", "executor-unmonitored"
AGENT_DOWN = "executor-agent-down"
MAX_AGENT_DOWN_CAUSE_CHARS = 160
"""The JVM cuts an exited agent's cause (its last log line) to this (``Protocol.executorAgentDown``)."""
OUTPUTS_LOST_LINE, REPLACEMENT = "executor-outputs-lost", "executor-replacement"
REMOVAL_FACTS = frozenset({"replaced", "app-end"})
"""What the JVM saw of a removal beyond Spark's text: it had asked Spark to kill and replace the
executor; the application had begun to stop. ``spark`` stands for neither."""
OUTCOMES = frozenset({"accepted", "refused", "unavailable"})
_COUNT = re.compile(r"[0-9]{1,18}")


@dataclass(frozen=True)
class ExecutorAdded:
    executor_id: str
    host: str


@dataclass(frozen=True)
class ExecutorRemoved:
    """``facts``: a subset of :data:`REMOVAL_FACTS`; ``reason``: Spark's text, as the JVM sent it."""

    executor_id: str
    facts: frozenset[str]
    reason: str


@dataclass(frozen=True)
class AgentNotStarted:
    executor_id: str
    reason: str


@dataclass(frozen=True)
class AgentDown:
    """An executor's plugin saw its agent process ``pid`` exit (or a restart of it fail): ``cause``
    is the JVM's printable text (the exit status and the agent's last log line, or why the
    restart failed); ``restart_in_ms`` when the JVM starts the agent again (0: now)."""

    executor_id: str
    pid: int
    restart_in_ms: int
    cause: str


@dataclass(frozen=True)
class OutputsLost:
    """An executor's plugin said its map outputs are lost; it ever started ``tasks_started`` tasks."""

    executor_id: str
    reason: str
    tasks_started: int


@dataclass(frozen=True)
class ReplacementOutcome:
    """What became of a ``kill-executor`` command (one of :data:`OUTCOMES`)."""

    executor_id: str
    outcome: str


ExecutorLine = (
    ExecutorAdded | ExecutorRemoved | AgentNotStarted | AgentDown | OutputsLost | ReplacementOutcome
)


def parse_executor_line(line: str) -> ExecutorLine | None:
    """The ``executor-...`` line's content, or None for anything not exactly of the grammar."""
    if len(line) > MAX_EXECUTOR_LINE_CHARS:
        return None
    verb, _, rest = line.partition(" ")
    if verb == REMOVED:
        words = rest.split(" ", 2)
        facts = _removal_facts(words[1]) if len(words) >= 2 else None
        if facts is not None and EXECUTOR_ID.fullmatch(words[0]):
            return ExecutorRemoved(words[0], facts, words[2] if len(words) == 3 else "")
        return None
    if verb == AGENT_DOWN:
        words = rest.split(" ", 3)
        if len(words) == 4 and EXECUTOR_ID.fullmatch(words[0]) and all(map(_COUNT.fullmatch, words[1:3])):
            cause = words[3]
            if 0 < len(cause) <= MAX_AGENT_DOWN_CAUSE_CHARS + len("...(cut)"):
                return AgentDown(words[0], int(words[1]), int(words[2]), cause)
        return None
    words = rest.split(" ")
    if not words or not EXECUTOR_ID.fullmatch(words[0]):
        return None
    if verb == ADDED and len(words) == 2 and HOST.fullmatch(words[1]):
        return ExecutorAdded(words[0], words[1])
    if verb == UNMONITORED and len(words) == 2 and REASON.fullmatch(words[1]):
        return AgentNotStarted(words[0], words[1])
    lost = verb == OUTPUTS_LOST_LINE and len(words) == 3
    if lost and REASON.fullmatch(words[1]) and _COUNT.fullmatch(words[2]):
        return OutputsLost(words[0], words[1], int(words[2]))
    if verb == REPLACEMENT and len(words) == 2 and words[1] in OUTCOMES:
        return ReplacementOutcome(words[0], words[1])
    return None


def _removal_facts(word: str) -> frozenset[str] | None:
    """``spark`` (no fact), or distinct :data:`REMOVAL_FACTS` joined by commas; None otherwise."""
    if word == "spark":
        return frozenset()
    facts = word.split(",")
    distinct = frozenset(facts)
    return distinct if distinct <= REMOVAL_FACTS and len(distinct) == len(facts) else None


# -- to us: the executor JVM's running tasks ---------------------------------------------------

TASK_LINES = ("tasks ", "stack ")
_TASK = re.compile(r"^(\d+):(\d+):(\d+):(\d+):(\d+):(-?\d+):(\d+)$")
_COLLECTOR = re.compile(r"^((?:[A-Za-z0-9._-]|%[0-9A-F]{2})+):(\d+):(\d+)$")


@dataclass(frozen=True, slots=True)
class Collector:
    """A garbage collector's totals as its MXBean gives them."""

    name: str
    count: int
    ms: int


@dataclass(frozen=True, slots=True)
class TaskFigures:
    task_id: int
    stage: int
    stage_attempt: int
    partition: int
    attempt: int
    cpu_ms: int
    """CPU time of the task's JVM thread; -1 if unknown."""
    running_ms: int


@dataclass(frozen=True, slots=True)
class TasksLine:
    cpu_ms: int
    """The process's CPU time; -1 if unknown."""
    jvm_ms: int
    """The JVM's monotonic clock when it wrote the line."""
    collectors: tuple[Collector, ...]
    tasks: tuple[TaskFigures, ...]


def parse_tasks(line: str) -> TasksLine:
    """``tasks <process cpu ms> <jvm clock ms> <collectors> [<task>:<stage>:<stage attempt>:
    <partition>:<attempt>:<thread cpu ms>:<running ms> ...]``, ``<collectors>`` being ``-`` or
    ``<name>:<count>:<ms>`` per collector, comma-separated, names percent-encoded
    (``Protocol.tasks``); ``ValueError`` if it is not one."""
    words = line.split()
    if len(words) < 4 or words[0] != "tasks":
        raise ValueError(f"not a tasks line: {line[:80]!r}")
    cpu_ms, jvm_ms = int(words[1]), int(words[2])
    collectors = []
    for part in [] if words[3] == "-" else words[3].split(","):
        found = _COLLECTOR.match(part)
        if found is None:
            raise ValueError(f"not a collector in a tasks line: {part[:80]!r}")
        collectors.append(Collector(_percent_decoded(found[1]), int(found[2]), int(found[3])))
    tasks = []
    for word in words[4:]:
        match = _TASK.match(word)
        if match is None:
            raise ValueError(f"not a task in a tasks line: {word[:80]!r}")
        tasks.append(TaskFigures(*(int(g) for g in match.groups())))
    return TasksLine(cpu_ms, jvm_ms, tuple(collectors), tuple(tasks))


def _percent_decoded(text: str) -> str:
    out = bytearray()
    i = 0
    while i < len(text):
        if text[i] == "%":
            out.append(int(text[i + 1 : i + 3], 16))
            i += 3
        else:
            out.append(ord(text[i]))
            i += 1
    return out.decode("utf-8", "replace")


def parse_stack(line: str) -> tuple[int, str] | None:
    """``stack <task> <escaped text>`` (``-`` when the task is not running): the task and the
    unescaped text; None if the line is not one."""
    words = line.split(" ", 2)
    if len(words) != 3 or words[0] != "stack" or not words[1].isdigit():
        return None
    return int(words[1]), unescape_line(words[2])


# -- from us: the protocol channel -------------------------------------------------------------

READY = "ARROWBEAT-READY"
_READY_KEY = re.compile(r"[a-z_]{1,32}")
_READY_VALUE = re.compile(r"[!-~]{1,256}")
_READY_BASE64 = re.compile(r"[A-Za-z0-9+/=]{1,1024}")
READY_BASE64_KEYS = frozenset({"ssl_cert", "ssl_key_secret"})
"""Ready fields that carry DER as base64 (``tls.ready_fields``): longer values, a narrower set."""
MAX_READY_FIELDS = 16


def ready_line(info: Mapping[str, object]) -> str:
    """``ARROWBEAT-READY k=v ...``: keys ``[a-z_]``, values visible ASCII without spaces."""
    if len(info) > MAX_READY_FIELDS:
        raise JvmCommandError(f"{len(info)} ready fields: the JVM takes at most {MAX_READY_FIELDS}")
    fields = []
    for key, value in info.items():
        text = str(value)
        pattern = _READY_BASE64 if key in READY_BASE64_KEYS else _READY_VALUE
        if not _READY_KEY.fullmatch(key) or not pattern.fullmatch(text):
            raise JvmCommandError(f"ready field {key!r} is not key=value of the protocol's form")
        fields.append(f"{key}={text}")
    return f"{READY} {' '.join(fields)}"


COMMAND = "ARROWBEAT-CMD"
KILL_EXECUTOR, OUTPUTS_LOST, JSTACK, KILL_TASK = "kill-executor", "outputs-lost", "jstack", "kill-task"
LOST_EXECUTOR = "lost-executor"
"""The kill of an executor whose heartbeats timed out: the JVM also tells Spark's scheduler it is
lost (``SparkInternals.executorLost``), so its running tasks are resubmitted at once."""
DECOMMISSION_EXECUTOR = "decommission-executor"
"""An executor slower than its peers (``onDegraded=exclude`` where ``spark.decommission.enabled`` is
on): the JVM has Spark decommission it (its blocks move), else kill and replace it."""
RM_UNREACHABLE = "rm-unreachable"


def command_line(verb: str, argument: str | int) -> str:
    """``ARROWBEAT-CMD <verb> <argument>`` for an argument the JVM takes (``Protocol.parseCommand``):
    an executor id of Spark's form (never ``driver``) for :data:`KILL_EXECUTOR`,
    :data:`LOST_EXECUTOR` and :data:`DECOMMISSION_EXECUTOR`, a reason token for
    :data:`OUTPUTS_LOST`, a task attempt id for :data:`JSTACK` and :data:`KILL_TASK`, the RM's
    ``host:port`` an agent cannot reach for :data:`RM_UNREACHABLE` (its JVM asks the driver
    whether the RM moved)."""
    if verb in (KILL_EXECUTOR, LOST_EXECUTOR, DECOMMISSION_EXECUTOR):
        if not isinstance(argument, str) or not is_executor(argument):
            raise JvmCommandError(f"no {verb} for executor id {str(argument)[:40]!r}: not a Spark id")
    elif verb == OUTPUTS_LOST:
        if not isinstance(argument, str) or not REASON.fullmatch(argument):
            raise JvmCommandError(f"no outputs-lost with reason {str(argument)[:40]!r}: expected [a-z-]")
    elif verb == RM_UNREACHABLE:
        if not isinstance(argument, str) or not ADDRESS.fullmatch(argument):
            raise JvmCommandError(f"no rm-unreachable for {str(argument)[:40]!r}: not host:port")
    elif verb in (JSTACK, KILL_TASK):
        if isinstance(argument, bool) or not isinstance(argument, int) or not 0 <= argument < MAX_TASK_ID:
            raise JvmCommandError(f"{argument!r} is not a task attempt id")
    else:
        raise JvmCommandError(f"no command {verb[:40]!r}")
    return f"{COMMAND} {verb} {argument}"


METRICS = "ARROWBEAT-METRICS"
MAX_METRICS_LINE_BYTES = 1900
"""Below the JVM's protocol line bound (2048 bytes, ``Sidecar.MAX_PROTOCOL_LINE_BYTES``)."""
MAX_METRICS_FIELDS = 64
"""Fields per line (``Protocol.MAX_METRICS_FIELDS``)."""
_METRIC_VALUE = re.compile(r"-?[0-9]{1,18}(?:\.[0-9]{1,9})?")


class Age(float):
    """A figure that is an age at send time: the JVM's gauge adds the time since the line arrived
    (on its own clock), so it keeps growing while no line comes. Written with a trailing ``+``."""


def metric_number(value: float) -> str:
    """``value`` as the protocol writes it: decimal, at most 3 fractional digits (and ``+`` for an
    :class:`Age`); a value that is not finite or too large has no form, and raises
    ``JvmCommandError``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise JvmCommandError(f"metric value {value!r} is not a finite number")
    text = f"{value:.3f}".rstrip("0").rstrip(".")
    text = "0" if text in ("", "-0") else text
    if not _METRIC_VALUE.fullmatch(text):
        raise JvmCommandError(f"metric value {value!r} is out of range")
    return f"{text}+" if isinstance(value, Age) else text


def metrics_lines(snapshot: int, fields: Mapping[str, float]) -> list[str]:
    """The lines of one snapshot, each within :data:`MAX_METRICS_LINE_BYTES` and
    :data:`MAX_METRICS_FIELDS` (the names are the caller's to check, ``plugin_metrics.allowed``)."""
    if isinstance(snapshot, bool) or not isinstance(snapshot, int) or not 0 <= snapshot < 10**18:
        raise JvmCommandError(f"{snapshot!r} is not a snapshot number")
    encoded = [f"{name}={metric_number(value)}" for name, value in fields.items()]
    head = f"{METRICS} {snapshot}"
    lines: list[str] = []
    current: list[str] = []
    size = len(head)
    for field in encoded:
        if current and (size + 1 + len(field) > MAX_METRICS_LINE_BYTES or len(current) == MAX_METRICS_FIELDS):
            lines.append(" ".join([head, *current]))
            current, size = [], len(head)
        current.append(field)
        size += 1 + len(field)
    if current or not lines:
        lines.append(" ".join([head, *current]))
    return lines


ALIVE = "ARROWBEAT-ALIVE"
MAX_ALIVE_NUMBER = 10**15
"""Both fields of an alive line stay below this (a wall clock in ms until the year 33658)."""


def alive_line(complete_until_ms: int, unsaved_rows: int) -> str:
    """``ARROWBEAT-ALIVE <complete until ms> <unsaved rows>``: a process's answer to a pulse
    (``Protocol.parseAlive``). ``complete_until_ms``: the wall-clock time before which its
    history is complete (every row recorded before it is committed; 0 if it keeps none, as an
    agent); ``unsaved_rows``: rows recorded but not yet committed. The driver JVM hands both to a
    restarted driver-side process, which records the gap (``spark_plugin.history.gaps``); an
    executor JVM only times the answer (its agent's hang check)."""
    for name, value in (("complete_until_ms", complete_until_ms), ("unsaved_rows", unsaved_rows)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_ALIVE_NUMBER:
            raise JvmCommandError(f"alive line: {name}={value!r} is not an integer in [0, 10^15)")
    return f"{ALIVE} {complete_until_ms} {unsaved_rows}"
