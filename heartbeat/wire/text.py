"""Text from the wire, made safe before it is logged or recorded.

A string a peer sent (an executor id, a host, an unregister reason, a status detail) may hold a
newline followed by something a log reader takes for a line of its own (the driver-side
process's stderr was read for commands). So: fields the RM records are checked
(``check_text``: bounded, printable, refused otherwise), and anything from a peer that is only
shown (``one_line``, ``excerpt``) is escaped and cut to a bounded length first.
"""

from __future__ import annotations

import re

from heartbeat.errors import MalformedMessageError

MAX_ID_CHARS = 256
MAX_REASON_CHARS = 512
MAX_METRIC_NAME_CHARS = 128
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")
"""A terminal colour (SGR) sequence, as Rust's error reports (delta-rs) may carry."""


def check_text(name: str, value: str, max_chars: int = MAX_ID_CHARS, *, allow_empty: bool = False) -> None:
    """Refuse (``MalformedMessageError``: INVALID_ARGUMENT) a value that is empty (unless allowed),
    longer than ``max_chars`` or holds anything but printable characters (``str.isprintable``:
    no newline, tab, control, line/paragraph separator or bidi override)."""
    if (not value and not allow_empty) or len(value) > max_chars or not value.isprintable():
        low = 0 if allow_empty else 1
        raise MalformedMessageError(
            f"{name} must be {low}-{max_chars} printable characters, got {excerpt(value)} "
            f"({len(value)} characters)"
        )


def excerpt(value: str, max_chars: int = 40) -> str:
    """A quoted, escaped start of ``value`` for a message: ``repr`` escapes what is unprintable."""
    if len(value) <= max_chars:
        return repr(value)
    return f"{value[:max_chars]!r}..."


def one_line(value: object, max_chars: int = 300, *, reflow: bool = False) -> str:
    """``value`` (its ``str``) on one line: unprintable characters escaped as ``repr`` does, cut to
    ``max_chars`` (then marked ``...(cut)``). The one escaping helper of arrowbeat: the plugin's
    ``wire_text`` is this with its own bounds.

    ``reflow`` is for a message written to be read over several lines (a delta-rs error chain:
    line breaks, indentation, terminal colours): its colours are dropped and each run of whitespace
    becomes one space before the rest, so it reads as one sentence. Without it a line break shows
    as ``\\n``: what a peer sent stays visible as sent."""
    text = value if isinstance(value, str) else str(value)
    if reflow:
        text = " ".join(_COLOUR.sub("", text).split())
    if not text.isprintable():
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[: max_chars * 2])
    if len(text) > max_chars:
        return f"{text[:max_chars]}...(cut)"
    return text


def clean_reason(reason: str) -> str:
    """Our own reason made fit to send: the RM refuses a reason that ``check_text`` refuses."""
    return one_line(reason, MAX_REASON_CHARS - len("...(cut)"))
