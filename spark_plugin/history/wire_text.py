"""Text that came from the wire, made fit to log or record: one printable line, bounded.

Executor ids, hosts, instance ids and event details reach the driver-side process from agents
(an unregister reason is whatever the agent said). Before any of it is logged or written to a
history table it passes through :func:`wire_text`, so a newline cannot start a forged log line
(or a forged line of ``lifecycle_feed``), a bidi mark cannot disguise a line, and a long value
cannot bloat a table. The heartbeat library already refuses unprintable ids and reasons at the
RM; this is the plugin's own guarantee, whatever the library lets through.
"""

from __future__ import annotations

from heartbeat import one_line

MAX_ID_CHARS = 256
"""Executor ids, hosts, instance ids: the RM's own limit."""
MAX_DETAIL_CHARS = 512
"""An event's detail (an unregister reason, a status)."""
MAX_ERROR_CHARS = 2000
"""A storage error (delta-rs) in a message: ``one_line(text, MAX_ERROR_CHARS, reflow=True)``."""


def wire_text(value: object, max_chars: int = MAX_DETAIL_CHARS) -> str:
    """``value`` as one printable line of at most ``max_chars`` (plus the ``...(cut)`` mark):
    every character ``str.isprintable`` refuses (newline, carriage return, other controls, line
    and paragraph separators, bidi overrides) is escaped as ``repr`` escapes it, by the heartbeat
    library's ``one_line`` (the one escaping helper) with the plugin's bound for a detail."""
    return one_line(value, max_chars)


__all__ = ["MAX_DETAIL_CHARS", "MAX_ERROR_CHARS", "MAX_ID_CHARS", "wire_text"]
