"""Spark's value formats, parsed as Spark parses them: durations, sizes, booleans.

The key table (``settings.config``) parses arrowbeat's own keys with these; the DataFrame API and
the jobs read some of Spark's keys (``spark.network.timeout``, AQE's sizes) with them too, so a
value means the same to arrowbeat as to Spark. Each raises ``ValueError`` on a malformed value;
the caller names the key.
"""

from __future__ import annotations

import re

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(us|ms|s|m|min|h|d)?\s*$")
_UNIT_SECONDS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str, bare_unit: str = "ms") -> float:
    """Spark's time format, in seconds: ``500ms``, ``2s``, ``1min``; a bare number is in
    ``bare_unit`` (milliseconds for arrowbeat's keys; Spark reads some of its own keys in seconds)."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(text)
    number, unit = match.groups()
    return float(number) * _UNIT_SECONDS[unit or bare_unit]


_BYTES = re.compile(r"^\s*(\d+)\s*([kmgtp]?)b?\s*$", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """Spark's size format: ``512m``, ``64mb``, ``1g``; a bare number is bytes."""
    match = _BYTES.match(text)
    if not match:
        raise ValueError(text)
    number, unit = match.groups()
    return int(number) << (10 * " kmgtp".index(unit.lower() or " "))


def parse_bool(text: str) -> bool:
    """``true`` or ``false``, any case, as Spark's boolean keys take them."""
    value = text.strip().lower()
    if value not in ("true", "false"):
        raise ValueError(text)
    return value == "true"


__all__ = ["parse_bool", "parse_bytes", "parse_duration"]
