"""What ``spark.arrowbeat.tables.path`` may be: a directory, or a URI both Spark and delta-rs read.

The rules are syntactic (no I/O), so the key table checks them when it loads a config
(``settings.config.load``) and the history's storage spells a checked URI for delta-rs with them
(``history.storage.locate``): both sides accept exactly the same paths. A message names the key
and the expected form, never a ``user:secret@`` part of the value.
"""

from __future__ import annotations

import re
from pathlib import Path

TABLES_SCHEMES: dict[str, str] = {
    "file": "file",
    "s3a": "s3",
    "s3": "s3",
    "abfss": "abfss",
    "abfs": "abfs",
    "gs": "gs",
    "hdfs": "hdfs",
    "viewfs": "viewfs",
}
"""The URI schemes ``tables.path`` takes (as Spark/Hadoop spell them) and the scheme delta-rs
writes each with (``spark_plugin.history.storage``); both sides read every one of them."""

_URI_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
_AUTHORITY = {
    "s3": re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]"),
    "abfss": re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{1,62}@[a-z0-9]{3,24}\.dfs\.[A-Za-z0-9.-]+"),
    "gs": re.compile(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]"),
    "hdfs": re.compile(r"[A-Za-z0-9.\-]*(?::\d{1,5})?"),
}
_AUTHORITY.update(abfs=_AUTHORITY["abfss"], viewfs=_AUTHORITY["hdfs"])


def local_tables_path(text: str) -> Path | None:
    """The directory a local (or mounted, shared) ``tables.path`` names: a bare path, or ``file:/p``,
    ``file:///p``, ``file://localhost/p``; None for any other URI."""
    match = _URI_SCHEME.match(text)
    if match is None or match.group(1).lower() != "file":
        return None if match else Path(text)
    rest = text[match.end() :]
    if rest.startswith("//"):
        host, _, path = rest[2:].partition("/")
        return Path("/" + path) if host in ("", "localhost") else None
    return Path(rest)


def tables_path_problem(key: str, text: str) -> str | None:
    """Why ``text`` cannot be ``key`` (``tables.path`` or the warehouse it defaults under), or None.
    The message never repeats a ``user:secret@`` part: it names the key and the expected form."""
    match = _URI_SCHEME.match(text)
    if match is None:
        return None
    scheme = match.group(1).lower()
    if scheme not in TABLES_SCHEMES:
        known = ", ".join(f"{s}://" for s in TABLES_SCHEMES)
        return (
            f"{key}: the scheme {scheme}:// is not one delta-rs (which writes the tables) and Spark both "
            f"read; use one of {known} or a directory path"
            + (
                " (for Azure Blob Storage, the ADLS Gen2 endpoint: abfss://)"
                if scheme.startswith("wasb")
                else ""
            )
            + (" (s3a:// is Hadoop's S3 client)" if scheme == "s3n" else "")
        )
    if scheme == "file":
        if local_tables_path(text) is None:
            return f"{key}: a file: URI must name a path on this host (file:/path or file:///path)"
        return None
    rest = text[match.end() :]
    if not rest.startswith("//"):
        return f"{key}: expected {scheme}://<authority>/<path>"
    authority, _, _path = rest[2:].partition("/")
    userinfo, at, _host = authority.rpartition("@")
    if at and (scheme not in ("abfss", "abfs") or ":" in userinfo):
        return (
            f"{key}: credentials do not belong in the URI ({scheme}://<user>:<secret>@...): set them as "
            "the application's spark.hadoop.* settings"
        )
    delta = TABLES_SCHEMES[scheme]
    if not _AUTHORITY[delta].fullmatch(authority):
        form = {
            "s3": "s3a://<bucket>/<path>",
            "abfss": f"{scheme}://<container>@<account>.dfs.core.windows.net/<path>",
            "abfs": f"{scheme}://<container>@<account>.dfs.core.windows.net/<path>",
            "gs": "gs://<bucket>/<path>",
            "hdfs": f"{scheme}://<namenode>[:port]/<path>",
            "viewfs": f"{scheme}://<cluster>/<path>",
        }[delta]
        return f"{key}: expected {form}"
    return None


__all__ = ["TABLES_SCHEMES", "local_tables_path", "tables_path_problem"]
