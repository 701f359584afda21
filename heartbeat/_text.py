"""Text from the wire, made safe before it is logged or recorded.

A string a peer sent (an executor id, a host, an unregister reason, a status detail) may hold a
newline followed by something a log reader takes for a line of its own (the driver-side
process's stderr was read for commands). So: fields the RM records are checked
(``check_text``: bounded, printable, refused otherwise), and anything from a peer that is only
shown (``one_line``, ``excerpt``) is escaped and cut to a bounded length first.
"""

from __future__ import annotations

from .errors import MalformedMessageError

MAX_ID_CHARS = 256
MAX_REASON_CHARS = 512
MAX_METRIC_NAME_CHARS = 128


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


def one_line(value: str, max_chars: int = 300) -> str:
    """``value`` on one line: unprintable characters escaped as ``repr`` does, cut to ``max_chars``."""
    if not value.isprintable():
        value = "".join(c if c.isprintable() else repr(c)[1:-1] for c in value[: max_chars * 2])
    if len(value) > max_chars:
        return f"{value[:max_chars]}...(cut)"
    return value


def clean_reason(reason: str) -> str:
    """Our own reason made fit to send: the RM refuses a reason that ``check_text`` refuses."""
    return one_line(reason, MAX_REASON_CHARS - len("...(cut)"))
