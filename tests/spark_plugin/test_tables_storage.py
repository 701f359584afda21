"""History tables on shared storage: ``tables.path`` as Spark spells it, mapped for delta-rs.

Unit tests for the scheme and credential mapping and the start-up validation; then the real
history writer, recovery and ``shuffle_metrics`` against a real S3 API on loopback (moto's server),
configured only through ``spark.hadoop.fs.s3a.*`` settings, with no credential in any log record
or error; and a shared-filesystem path behaving exactly as a local one always did.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spark_plugin.history import (
    EXECUTOR_EVENTS,
    HEARTBEATS,
    HistoryWriter,
    TablePathError,
    TablesLocation,
    known_executors,
    locate,
    tables_location,
)
from spark_plugin.history.shuffle_metrics import append_rows, tables_root_of
from spark_plugin.history.storage import tables_root
from spark_plugin.jvm.sidecar import REDACTED, _Redacting, secret_values
from spark_plugin.settings.config import ConfigError, load

ACCESS_KEY = "AKIAARROWBEATTEST0001"
SECRET_KEY = "arrowbeat-s3-secret-0123456789abcdef"
SESSION_TOKEN = "arrowbeat-session-token-XYZ987"
CREDENTIALS = (ACCESS_KEY, SECRET_KEY, SESSION_TOKEN)
S3A = "spark.hadoop.fs.s3a."
SERVER_LOGGERS = ("werkzeug", "moto", "botocore", "boto3", "urllib3", "s3transfer")


def tables_settings(path: str, **extra: str) -> dict[str, str]:
    return {"spark.arrowbeat.tables.path": path, "spark.app.id": "app-s3", **extra}


# --- the mapping ------------------------------------------------------------------------------


def test_s3a_settings_become_delta_rs_options_and_stay_out_of_repr_and_str() -> None:
    settings = {
        f"{S3A}access.key": ACCESS_KEY,
        f"{S3A}secret.key": SECRET_KEY,
        f"{S3A}session.token": SESSION_TOKEN,
        f"{S3A}endpoint": "minio.internal:9000",
        f"{S3A}connection.ssl.enabled": "false",
        f"{S3A}path.style.access": "true",
        f"{S3A}endpoint.region": "eu-west-1",
    }
    location = locate("s3a://bkt/arrowbeat/", settings)
    assert (location.uri, location.delta_uri, location.local) == (
        "s3a://bkt/arrowbeat",
        "s3://bkt/arrowbeat",
        None,
    )
    assert location.table_uri("heartbeats") == "s3://bkt/arrowbeat/heartbeats"
    assert location.spark_uri("heartbeats") == "s3a://bkt/arrowbeat/heartbeats"
    options = location.storage_options
    assert options["AWS_ACCESS_KEY_ID"] == ACCESS_KEY
    assert options["AWS_SECRET_ACCESS_KEY"] == SECRET_KEY
    assert options["AWS_SESSION_TOKEN"] == SESSION_TOKEN
    assert options["AWS_REGION"] == "eu-west-1"
    assert options["AWS_ENDPOINT_URL"] == "http://minio.internal:9000"  # ssl off: S3A's http
    assert options["AWS_ALLOW_HTTP"] == "true"
    assert options["conditional_put"] == "etag"  # safe commits, one writer or many
    assert "AWS_S3_ALLOW_UNSAFE_RENAME" not in options
    assert "AWS_VIRTUAL_HOSTED_STYLE_REQUEST" not in options
    for text in (repr(location), str(location)):
        assert not any(secret in text for secret in CREDENTIALS), text
    assert (
        location.scrub(f"denied for {ACCESS_KEY} with {SECRET_KEY}")
        == "denied for <redacted> with <redacted>"
    )


def test_s3a_defaults_virtual_hosted_https_and_per_bucket_settings_win() -> None:
    settings = {
        f"{S3A}endpoint": "s3.eu-central-1.amazonaws.com",
        f"{S3A}access.key": "GLOBALKEY000",
        f"{S3A}bucket.logs.access.key": "BUCKETKEY000",
    }
    options = locate("s3a://logs/t", settings).storage_options
    assert options["AWS_ENDPOINT_URL"] == "https://logs.s3.eu-central-1.amazonaws.com"
    assert options["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] == "true"
    assert options["AWS_ACCESS_KEY_ID"] == "BUCKETKEY000"
    assert "AWS_ALLOW_HTTP" not in options
    bare = locate("s3://other/t", {}).storage_options  # no settings: delta-rs's AWS credential chain
    assert "AWS_ENDPOINT_URL" not in bare and "AWS_ACCESS_KEY_ID" not in bare


def test_abfss_gs_and_hdfs_map_their_connectors_settings() -> None:
    host = "acct01.dfs.core.windows.net"
    azure = locate(
        f"abfss://logs@{host}/arrowbeat",
        {f"spark.hadoop.fs.azure.account.key.{host}": "azure-key-0123456789=="},
    )
    assert azure.delta_uri == f"abfss://logs@{host}/arrowbeat"
    assert azure.storage_options["azure_storage_account_name"] == "acct01"
    assert azure.storage_options["azure_storage_account_key"] == "azure-key-0123456789=="
    assert azure.secrets() == ["azure-key-0123456789=="]
    keyfile = "/etc/gcp/key.json"
    gcs = locate("gs://bkt/t", {"spark.hadoop.google.cloud.auth.service.account.json.keyfile": keyfile})
    assert (gcs.delta_uri, gcs.storage_options["google_service_account"]) == ("gs://bkt/t", keyfile)
    hdfs = locate("hdfs://nn:8020/t", {"spark.hadoop.dfs.client.use.datanode.hostname": "true"})
    assert hdfs.delta_uri == "hdfs://nn:8020/t"
    assert hdfs.storage_options["dfs.client.use.datanode.hostname"] == "true"


@pytest.mark.parametrize(
    "text", ["/shared/t", "file:/shared/t", "file:///shared/t", "file://localhost/shared/t"]
)
def test_local_and_file_uris_are_the_directory_they_name(text: str) -> None:
    config = load(tables_settings(text))
    assert tables_root(config, {}) == Path("/shared/t")
    location = locate(tables_root(config, {}))
    assert (location.local, location.storage_options, location.options()) == (Path("/shared/t"), {}, None)


def test_the_default_under_the_warehouse_follows_its_scheme(tmp_path: Path) -> None:
    config = load({})
    assert (
        tables_root(config, {"spark.sql.warehouse.dir": f"file:{tmp_path}/wh"})
        == tmp_path / "wh" / "arrowbeat"
    )
    assert tables_root(config, {"spark.sql.warehouse.dir": "s3a://lake/wh/"}) == "s3a://lake/wh/arrowbeat"


# --- validation at start-up -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("wasbs://c@a.blob.core.windows.net/t", "abfss://"),
        ("s3n://bkt/t", "s3a://"),
        ("ftp://host/t", "not one delta-rs"),
        ("s3a:/bkt/t", "s3a://<authority>/<path>"),
        ("s3a://Bad_Bucket/t", "s3a://<bucket>/<path>"),
        ("abfss://acct.dfs.core.windows.net/t", "<container>@<account>.dfs.core.windows.net"),
        ("file://otherhost/t", "a path on this host"),
    ],
)
def test_a_tables_path_neither_side_reads_is_named_at_start_up(text: str, says: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load(tables_settings(text))
    (problem,) = raised.value.problems
    assert problem.startswith("spark.arrowbeat.tables.path") and says in problem, problem


def test_credentials_in_the_uri_are_refused_without_repeating_them() -> None:
    with pytest.raises(ConfigError) as raised:
        load(tables_settings(f"s3a://{ACCESS_KEY}:{SECRET_KEY}@bkt/t"))
    text = str(raised.value)
    assert "spark.hadoop" in text and ACCESS_KEY not in text and SECRET_KEY not in text


@pytest.mark.parametrize(
    "text",
    [
        "s3a://my-bucket/a/b",
        "s3://my.bucket/a",
        "abfss://logs@acct01.dfs.core.windows.net/a",
        "gs://b-1/a",
        "hdfs://nn:8020/a",
        "hdfs:///a",
        "viewfs://cluster/a",
    ],
)
def test_every_supported_form_loads(text: str) -> None:
    assert load(tables_settings(text)).tables_path == text


def test_the_driver_sides_log_redacts_storage_credentials() -> None:
    host = "acct01.dfs.core.windows.net"
    settings = {
        f"{S3A}access.key": ACCESS_KEY,
        f"{S3A}secret.key": SECRET_KEY,
        f"{S3A}session.token": SESSION_TOKEN,
        f"spark.hadoop.fs.azure.account.key.{host}": "azure-key-0123456789==",
    }
    secrets = secret_values(settings)
    assert sorted(secrets) == sorted([*CREDENTIALS, "azure-key-0123456789=="])
    formatter = _Redacting("%(message)s", secrets)
    record = logging.LogRecord(
        "arrowbeat.history", logging.ERROR, __file__, 1, "%s", (" ".join(secrets),), None
    )
    assert formatter.format(record) == " ".join([REDACTED] * 4)


# --- real S3 on loopback ----------------------------------------------------------------------


class _OneRequestAtATime:
    """WSGI middleware running one request at a time, body included.

    moto checks ``If-None-Match: *`` and then stores the object as two steps, so two threads
    putting the same Delta log version can both pass the check and one commit overwrites the
    other (a lost commit, seen in CI). S3 makes the conditional put atomic; serialising moto's
    requests gives the test server the same guarantee, so a lost commit is our bug, not moto's."""

    def __init__(self, app: Any) -> None:
        self._app = app
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        with self._lock:
            return list(self._app(environ, start_response))


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 app behind a threaded server on a free loopback port, answering one request at a
    time (:class:`_OneRequestAtATime`), with bucket ``arrowbeat``; ``host:port``."""
    import boto3  # type: ignore[import-untyped]
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    app = _OneRequestAtATime(DomainDispatcherApplication(create_backend_app))
    server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=MotoRequestHandler)
    thread = threading.Thread(target=server.serve_forever, name="moto-s3", daemon=True)
    thread.start()
    try:
        host, port = str(server.server_address[0]), int(server.server_address[1])
        client = boto3.client(
            "s3",
            endpoint_url=f"http://{host}:{port}",
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name="us-east-1",
        )
        client.create_bucket(Bucket="arrowbeat")
        yield f"{host}:{port}"
    finally:
        server.shutdown()
        thread.join(timeout=30)
        server.server_close()


def s3a_settings(endpoint: str, path: str) -> dict[str, str]:
    """What an application sets for S3A: its settings are the only source of the credentials."""
    return tables_settings(
        path,
        **{
            f"{S3A}access.key": ACCESS_KEY,
            f"{S3A}secret.key": SECRET_KEY,
            f"{S3A}session.token": SESSION_TOKEN,
            f"{S3A}endpoint": endpoint,
            f"{S3A}connection.ssl.enabled": "false",
            f"{S3A}path.style.access": "true",
            f"{S3A}endpoint.region": "us-east-1",
        },
    )


def event(executor_id: str, kind: str, second: int, app_id: str = "app-s3") -> dict[str, object]:
    return {
        "app_id": app_id,
        "executor_id": executor_id,
        "host": "10.0.0.7",
        "instance_id": f"i-{executor_id}",
        "ts": dt.datetime(2026, 11, 23, 5, 0, second, tzinfo=dt.UTC),
        "event": kind,
        "detail": None,
    }


def beat(executor_id: str, second: int) -> dict[str, object]:
    row = {k: v for k, v in event(executor_id, "", second).items() if k not in ("event", "detail")}
    row.update(rtt_ms=0.5, gap_ms=None, jvm_pulse_age_ms=5, slots_total=1, slots_busy=0)
    row.update(running_tasks=0, rss_bytes=1 << 20)
    return row


def assert_no_credentials(caplog: pytest.LogCaptureFixture, *texts: str) -> None:
    ours = [r for r in caplog.records if not r.name.startswith(SERVER_LOGGERS)]
    for text in [*(r.getMessage() for r in ours), *(str(r.exc_info) for r in ours), *texts]:
        assert not any(secret in text for secret in CREDENTIALS), text


def test_history_written_to_s3a_with_spark_settings_reads_back(
    s3_endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The writer, maintenance and recovery on a real S3 API, credentials only from
    ``spark.hadoop.fs.s3a.*``; read back by a plain delta-rs reader; nothing logged leaks them."""
    from deltalake import DeltaTable

    caplog.set_level(logging.DEBUG)
    settings = s3a_settings(s3_endpoint, "s3a://arrowbeat/apps/history")
    location = tables_location(load(settings), settings)
    writer = HistoryWriter(location, flush_interval_s=60)
    writer.open()
    for second in range(5):
        writer.append(EXECUTOR_EVENTS.name, event(str(second), "REGISTERED", second))
        writer.append(HEARTBEATS.name, beat(str(second), second))
    writer.append(EXECUTOR_EVENTS.name, event("0", "UNREGISTERED", 10))
    writer.flush()
    writer.maintain()
    logging.getLogger("arrowbeat.test").info("history tables at %s (%r)", location, location)

    reader_options = {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_ENDPOINT_URL": f"http://{s3_endpoint}",
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
    }
    events = DeltaTable("s3://arrowbeat/apps/history/executor_events", storage_options=reader_options)
    assert events.to_pyarrow_table().num_rows == 6
    heartbeats = DeltaTable("s3://arrowbeat/apps/history/heartbeats", storage_options=reader_options)
    assert sorted(heartbeats.to_pyarrow_table()["executor_id"].to_pylist()) == ["0", "1", "2", "3", "4"]
    assert {e.executor_id for e in known_executors(location, "app-s3")} == {"1", "2", "3", "4"}
    assert writer.stats()[EXECUTOR_EVENTS.name]["commits"] == 1
    restarted = HistoryWriter(location, flush_interval_s=60)  # a restarted RM: tables checked, kept
    restarted.open()
    assert (
        events.version()
        == DeltaTable("s3://arrowbeat/apps/history/executor_events", storage_options=reader_options).version()
    )
    assert_no_credentials(caplog)


def test_two_applications_appending_to_one_s3_table_lose_no_commit(s3_endpoint: str) -> None:
    """Applications sharing a tables path are concurrent writers of the same tables: the
    conditional put makes each commit version land once, and the loser re-commits the next."""
    from deltalake import DeltaTable

    settings = s3a_settings(s3_endpoint, "s3a://arrowbeat/shared")
    location = tables_location(load(settings), settings)
    writers = [HistoryWriter(location, flush_interval_s=60) for _ in range(2)]
    for writer in writers:
        writer.open()
    start = threading.Barrier(len(writers))

    def run(app: int, writer: HistoryWriter) -> None:
        start.wait(timeout=30)
        for batch in range(8):
            writer.append(EXECUTOR_EVENTS.name, event(f"{app}-{batch}", "REGISTERED", batch, f"app-{app}"))
            writer.flush()

    threads = [threading.Thread(target=run, args=(i, w)) for i, w in enumerate(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    table = DeltaTable(location.table_uri(EXECUTOR_EVENTS.name), storage_options=location.options())
    ids = table.to_pyarrow_table()["executor_id"].to_pylist()
    assert sorted(ids) == sorted(f"{a}-{b}" for a in range(2) for b in range(8))
    assert all(w.stats()[EXECUTOR_EVENTS.name]["buffered"] == 0 for w in writers)


class FakeSpark:
    """What ``tables_root_of`` reads: ``spark.sparkContext.getConf().getAll()``."""

    def __init__(self, entries: dict[str, str]) -> None:
        conf = type("Conf", (), {"getAll": staticmethod(lambda: list(entries.items()))})()
        self.sparkContext = type("Context", (), {"getConf": staticmethod(lambda: conf)})()


def test_the_drivers_shuffle_metrics_reach_s3_with_the_same_settings(s3_endpoint: str) -> None:
    from deltalake import DeltaTable

    root = tables_root_of(FakeSpark(s3a_settings(s3_endpoint, "s3a://arrowbeat/metrics")))
    assert isinstance(root, TablesLocation) and root.storage_options["AWS_SECRET_ACCESS_KEY"] == SECRET_KEY
    report = {
        "side": "write",
        "partition": 0,
        "attempt": 1,
        "executor": 1,
        "bytes": 10,
        "batches": 1,
        "rows": 2,
        "spill_bytes": 0,
        "blocked_s": 0.0,
        "seconds": 0.1,
        "recomputed": False,
        "recomputed_maps": [],
    }
    append_rows(root, "app-s3", 3, [report])
    table = DeltaTable(root.table_uri("shuffle_metrics"), storage_options=root.options())
    assert table.to_pyarrow_table()["shuffle_id"].to_pylist() == [3]


def test_a_missing_bucket_is_named_without_credentials(
    s3_endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    settings = s3a_settings(s3_endpoint, "s3a://no-such-bucket/t")
    with pytest.raises(TablePathError) as raised:
        HistoryWriter(tables_location(load(settings), settings), flush_interval_s=60).open()
    text = str(raised.value)
    assert "s3a://no-such-bucket/t/" in text and "\n" not in text and "\x1b" not in text, text
    assert raised.value.__cause__ is None and raised.value.__suppress_context__
    assert_no_credentials(caplog, text)


# --- a shared file system path: exactly as before ---------------------------------------------


def test_a_shared_directory_path_writes_as_a_local_path_always_did(tmp_path: Path) -> None:
    from deltalake import DeltaTable

    settings = tables_settings(f"file://{tmp_path}/shared")
    location = tables_location(load(settings), settings)
    assert location.local == tmp_path / "shared" and str(location) == str(tmp_path / "shared")
    writer = HistoryWriter(location, flush_interval_s=60)
    writer.open()
    writer.append(EXECUTOR_EVENTS.name, event("1", "REGISTERED", 1))
    writer.flush()
    assert (tmp_path / "shared" / EXECUTOR_EVENTS.name / "_delta_log").is_dir()
    assert DeltaTable(str(tmp_path / "shared" / EXECUTOR_EVENTS.name)).to_pyarrow_table().num_rows == 1
    assert [e.executor_id for e in known_executors(tmp_path / "shared", "app-s3")] == ["1"]
