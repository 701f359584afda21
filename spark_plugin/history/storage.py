"""Where the history tables live, spelled for each of their two kinds of reader.

``spark.arrowbeat.tables.path`` is written as Spark reads it: a directory (a local disk, or a
mount every host shares), or a Hadoop URI (``s3a://``, ``abfss://``, ``gs://``, ``hdfs://``).
Spark's readers (``jobs/``, the user's queries) take that URI as it is. The writers here use
delta-rs, which has its own schemes and takes credentials as *storage options*: :func:`locate`
maps one to the other, reading the credentials and endpoint from the application's own
``spark.hadoop.*`` settings, so one set of settings serves both sides.

Credentials never leave a :class:`TablesLocation` in text: its ``repr`` and ``str`` leave them out,
and :meth:`TablesLocation.scrub` takes them out of any message (delta-rs errors may quote a
request) before it is logged or raised.

Concurrent commits on S3. A Delta commit is "create ``_delta_log/<version>.json`` unless it
exists"; S3 has no atomic rename, so delta-rs needs either a conditional put or an opt-out. The
driver-side process is the only writer of its application's rows, but several applications
(every one that shares a warehouse) append to the same tables, and the application's driver
appends ``shuffle_metrics`` beside them. ``AWS_S3_ALLOW_UNSAFE_RENAME`` (copy, then delete) is
safe only with exactly one writer per table: two applications would silently overwrite each
other's commit. So the location asks for ``conditional_put=etag``: the commit carries
``If-None-Match: *``, the store refuses a second writer of the same version (412), and delta-rs
re-reads the log and commits the next version: correct with one writer and with many, and no lock
table to run. AWS S3 has supported it since August 2024, as do MinIO, Ceph RGW, R2 and moto; a
store without conditional writes fails the commit with a clear error rather than losing data.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from spark_plugin.errors import TablePathError
from spark_plugin.settings.config import ArrowBeatConfig
from spark_plugin.settings.tables_uri import TABLES_SCHEMES, local_tables_path, tables_path_problem

HADOOP = "spark.hadoop."

#: Bounded retries: delta-rs's defaults (10 retries over up to 3 minutes) would hold the driver-side
#: process's start-up (and each flush) far past the JVM's startupTimeout on an unreachable store;
#: the history writer retries a failed commit itself on its next flush.
RETRIES: Mapping[str, str] = {"max_retries": "3", "retry_timeout": "15s", "connect_timeout": "5s"}

_SECRET_OPTION = re.compile(r"secret|password|token|access_key|account_key|sas|key_id", re.IGNORECASE)
"""Storage options whose values are credentials: scrubbed from every message."""

_MIN_SECRET_CHARS = 6
"""Shorter values are not scrubbed (they would redact ordinary words); the sidecar's rule too."""


@dataclass(frozen=True)
class TablesLocation:
    """The tables' root: ``uri`` as Spark reads it, ``delta_uri`` + ``storage_options`` as
    delta-rs writes it, ``local`` the directory when it is one (a local or mounted path)."""

    uri: str
    delta_uri: str
    storage_options: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)
    """Credentials and endpoint for delta-rs; never in ``repr``, ``str`` or any message."""
    local: Path | None = None

    def __str__(self) -> str:
        return self.uri

    def table_uri(self, name: str) -> str:
        """Table ``name`` as delta-rs opens it."""
        return str(self.local / name) if self.local is not None else f"{self.delta_uri}/{name}"

    def spark_uri(self, name: str) -> str:
        """Table ``name`` as Spark reads it (and as messages name it)."""
        return str(self.local / name) if self.local is not None else f"{self.uri}/{name}"

    def options(self) -> dict[str, str] | None:
        """The storage options for a delta-rs call (None for a directory: delta-rs's default)."""
        return dict(self.storage_options) if self.storage_options else None

    def secrets(self) -> list[str]:
        return [
            v
            for k, v in self.storage_options.items()
            if _SECRET_OPTION.search(k) and len(v) >= _MIN_SECRET_CHARS
        ]

    def scrub(self, text: object) -> str:
        """``text`` with every credential of this location replaced by ``<redacted>``."""
        out = str(text)
        for secret in self.secrets():
            out = out.replace(secret, "<redacted>")
        return out


def tables_root(config: ArrowBeatConfig, settings: Mapping[str, str]) -> Path | str:
    """``spark.arrowbeat.tables.path``, else ``<spark.sql.warehouse.dir>/arrowbeat``, as Spark's
    readers name it: a ``Path`` for a directory (a local or shared mount), the URI itself for an
    object store or HDFS (:func:`locate` spells it for delta-rs)."""
    if config.tables_path:
        local = local_tables_path(config.tables_path)
        return local if local is not None else config.tables_path.rstrip("/")
    warehouse = settings.get("spark.sql.warehouse.dir") or "spark-warehouse"
    local = local_tables_path(warehouse)
    if local is None:
        return f"{warehouse.rstrip('/')}/arrowbeat"
    return local.absolute() / "arrowbeat"


def locate(root: TablesLocation | Path | str, settings: Mapping[str, str] | None = None) -> TablesLocation:
    """``root`` (``tables_root``'s answer, or a path or URI) with its delta-rs spelling and, from
    ``settings`` (the application's settings, ``spark.hadoop.*`` among them), its storage options.
    Raises :class:`TablePathError` naming the expected form for a URI neither side reads."""
    if isinstance(root, TablesLocation):
        return root
    if isinstance(root, Path):
        return TablesLocation(str(root), str(root), {}, root)
    local = local_tables_path(root)
    if local is not None:
        return TablesLocation(str(local), str(local), {}, local)
    if problem := tables_path_problem("spark.arrowbeat.tables.path", root):
        raise TablePathError(problem)
    uri = root.rstrip("/")
    scheme, _, rest = uri.partition("://")
    delta_scheme = TABLES_SCHEMES[scheme.lower()]
    authority = rest.partition("/")[0]
    options = {**RETRIES, **_OPTIONS[delta_scheme](authority, settings or {})}
    return TablesLocation(uri, f"{delta_scheme}://{rest}", options)


def tables_location(config: ArrowBeatConfig, settings: Mapping[str, str]) -> TablesLocation:
    """The application's tables root (``tables.path`` or under the warehouse), located."""
    return locate(tables_root(config, settings), settings)


def _s3(bucket: str, settings: Mapping[str, str]) -> dict[str, str]:
    """S3A's settings as delta-rs (object_store) options; a per-bucket setting
    (``fs.s3a.bucket.<bucket>.<name>``) wins over the global one, as in S3A."""

    def get(name: str) -> str:
        value = settings.get(f"{HADOOP}fs.s3a.bucket.{bucket}.{name}") or settings.get(
            f"{HADOOP}fs.s3a.{name}"
        )
        return (value or "").strip()

    options = {"conditional_put": "etag"}  # see the module docstring
    for name, option in (
        ("access.key", "AWS_ACCESS_KEY_ID"),
        ("secret.key", "AWS_SECRET_ACCESS_KEY"),
        ("session.token", "AWS_SESSION_TOKEN"),
        ("endpoint.region", "AWS_REGION"),
    ):
        if value := get(name):
            options[option] = value
    endpoint = get("endpoint")
    if endpoint:
        if "://" not in endpoint:  # S3A takes a bare host and picks the scheme by ssl.enabled
            ssl = get("connection.ssl.enabled").lower() != "false"
            endpoint = f"{'https' if ssl else 'http'}://{endpoint}"
        endpoint = endpoint.rstrip("/")
        if get("path.style.access").lower() != "true":
            # S3A's default, virtual-hosted requests: object_store wants the bucket in the endpoint.
            scheme, _, host = endpoint.partition("://")
            endpoint = f"{scheme}://{bucket}.{host}"
            options["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] = "true"
        options["AWS_ENDPOINT_URL"] = endpoint
        if endpoint.startswith("http://"):
            options["AWS_ALLOW_HTTP"] = "true"
    return options


def _azure(authority: str, settings: Mapping[str, str]) -> dict[str, str]:
    """ABFS's account key (or fixed SAS token) for ``<container>@<account>.dfs.core.windows.net``."""
    host = authority.partition("@")[2]
    options = {"azure_storage_account_name": host.partition(".")[0]}
    if key := settings.get(f"{HADOOP}fs.azure.account.key.{host}", "").strip():
        options["azure_storage_account_key"] = key
    if sas := settings.get(f"{HADOOP}fs.azure.sas.fixed.token.{host}", "").strip():
        options["azure_storage_sas_token"] = sas
    return options


def _gcs(_bucket: str, settings: Mapping[str, str]) -> dict[str, str]:
    """The GCS connector's service-account key file (a path on the driver's host)."""
    for key in ("google.cloud.auth.service.account.json.keyfile", "fs.gs.auth.service.account.json.keyfile"):
        if path := settings.get(f"{HADOOP}{key}", "").strip():
            return {"google_service_account": path}
    return {}


def _hdfs(_authority: str, settings: Mapping[str, str]) -> dict[str, str]:
    """delta-rs's HDFS client (hdfs-native) reads ``HADOOP_CONF_DIR`` and takes Hadoop settings as
    options: the application's ``spark.hadoop.*`` ones, as Spark hands them to Hadoop."""
    return {k.removeprefix(HADOOP): v for k, v in settings.items() if k.startswith(HADOOP)}


_OPTIONS: dict[str, Callable[[str, Mapping[str, str]], dict[str, str]]] = {
    "s3": _s3,
    "abfss": _azure,
    "abfs": _azure,
    "gs": _gcs,
    "hdfs": _hdfs,
    "viewfs": _hdfs,
}
