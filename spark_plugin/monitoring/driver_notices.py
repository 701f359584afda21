"""The driver side of the agents' notices: each becomes one executor event, however often it came.

An agent posts a finding on its ``heartbeat.NoticeBoard`` (today a damaged map output of its own,
``spark_plugin.shuffle.agent.corrupt_outputs``), and the board carries it in several payloads so that a
lost heartbeat does not lose it. Here the first payload that carries a notice makes it an
``ExecutorEvent`` of the notice's kind (``SHUFFLE_CORRUPT``), with the agent's one-line detail
(which names the shuffle, the map partition and the file); the later ones are recognised by
``(executor id, notice id)`` and record nothing. The executor id, not the registration instance,
is the key: a re-registered agent's board goes on carrying what it carried before. A notice's id
holds a token of the agent process that posted it, so a restarted agent's notices are new.

Memory is bounded: the last ``max_seen`` keys are kept (oldest forgotten first), far more than
the boards of live executors can carry at once (``heartbeat.payload.MAX_NOTICES`` each).

A restarted RM knows no ids, but boards may still carry what its predecessor recorded: it adopts
the recorded events (``history.recovery``, executor and detail as the table holds them) and takes
a notice of the same executor with the same detail for recorded. The detail names the damaged
file, which an agent handles once, so an equal detail is the same finding.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from heartbeat import EventKind, ExecutorEvent, HeartbeatRecord
from heartbeat.payload import NOTICE_KINDS
from spark_plugin.history.wire_text import wire_text

MAX_SEEN = 20_000
"""Notices remembered as recorded (a key is a few hundred bytes at most: a few MiB in all)."""


class NoticeEvents:
    """Turns the notices in heartbeats into executor events, each once. Called from the RM's
    event thread only (``processes.driver.EventRouter``)."""

    def __init__(self, max_seen: int = MAX_SEEN) -> None:
        if max_seen < 1:
            raise ValueError(f"max_seen must be at least 1, got {max_seen}")
        self._seen: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._max_seen = max_seen
        self._recorded: OrderedDict[tuple[str, str], None] = OrderedDict()
        """``(executor id, detail as recorded)`` of a predecessor's events (``adopt``)."""

    def adopt(self, recorded: Iterable[tuple[str, str]]) -> None:
        """Events ``(executor id, detail)`` a previous RM of this application recorded (the newest
        ``max_seen`` are kept): a notice still carried that matches one records nothing again."""
        for key in recorded:
            self._recorded[key] = None
            self._recorded.move_to_end(key)
            while len(self._recorded) > self._max_seen:
                self._recorded.popitem(last=False)

    def remembered(self) -> int:
        """How many notices are remembered as recorded (at most ``max_seen``)."""
        return len(self._seen)

    def on_heartbeat(self, record: HeartbeatRecord) -> list[ExecutorEvent]:
        """The events of the notices ``record`` carries that were not recorded before."""
        out = []
        for notice in record.payload.notices:
            key = (record.executor_id, notice.id)
            if key in self._seen:
                self._seen.move_to_end(key)  # still carried: forget others first
                continue
            if notice.kind not in NOTICE_KINDS:  # the wire lets none through: never a lifecycle event
                continue
            kind = EventKind(notice.kind)
            self._seen[key] = None
            while len(self._seen) > self._max_seen:
                self._seen.popitem(last=False)
            if self._recorded and (record.executor_id, wire_text(notice.detail)) in self._recorded:
                continue  # recorded by the RM before a restart
            out.append(
                ExecutorEvent(
                    kind, record.executor_id, record.host, record.instance_id, record.ts, notice.detail
                )
            )
        return out
