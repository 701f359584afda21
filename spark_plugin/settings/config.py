"""Every ``spark.arrowbeat.*`` key, declared once: type, default, doc, and the form it expects.

Nothing else in arrowbeat reads a ``spark.arrowbeat.*`` key by its string with a default of its
own: the plugin's processes parse the settings the JVM hands them with :func:`load`, the user's
driver (the DataFrame API, the shuffle metrics) parses its ``SparkConf`` with
:func:`from_spark_conf`, and the heartbeat library gets its validated settings as a
``HeartbeatServices`` from :meth:`ArrowBeatConfig.heartbeat_services`. Either way *all* problems
are reported at once in one :class:`ConfigError`, each naming the key and the expected form.
The documentation site's configuration reference is generated from :data:`OPTIONS` when the site
is built (``python -m spark_plugin config-docs`` prints it) and a test checks the two agree.

The value formats the keys share live beside it: Spark's units in ``settings.units``, the rules
of ``tables.path`` in ``settings.tables_uri``; ``settings.tls`` names the ``ssl.*`` keys through
:func:`key_of`, never by a string of its own.
"""

from __future__ import annotations

import math
import os
import re
import stat
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from spark_plugin.errors import ConfigError as ConfigError  # re-exported: its historical home
from spark_plugin.settings.tables_uri import tables_path_problem
from spark_plugin.settings.units import parse_bool, parse_bytes, parse_duration

if TYPE_CHECKING:
    from heartbeat.retry import RetryPolicy
    from heartbeat.services import HeartbeatServices

PREFIX = "spark.arrowbeat."


def _parse_int(text: str) -> int:
    return int(text.strip())


def _parse_str(text: str) -> str:
    return text


def _parse_float(text: str) -> float:
    value = float(text.strip())
    if not math.isfinite(value):
        raise ValueError(text)
    return value


def _parse_host(text: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9.\-:\[\]]*", text):
        raise ValueError(text)
    return text


def _parse_address(text: str) -> str:
    if text and not re.fullmatch(r"[A-Za-z0-9.\-\[\]:]+:\d{1,5}", text):
        raise ValueError(text)
    return text


_SERVER_NAME = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
)


def _parse_server_name(text: str) -> str:
    """A DNS name without wildcard, as a certificate's subjectAltName lists it; empty = derived."""
    if text and not _SERVER_NAME.fullmatch(text):
        raise ValueError(text)
    return text


_BASE64_LINE = re.compile(r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?")


def _parse_base64_line(text: str) -> str:
    """One line of standard base64, at most 16 KiB: the generated TLS material (see settings.tls)."""
    if len(text) > 16384 or not _BASE64_LINE.fullmatch(text):
        raise ValueError(text)
    return text


def _choice(*allowed: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in allowed:
            raise ValueError(text)
        return value

    return parse


def _log_level(text: str) -> str:
    return _choice("debug", "info", "warning", "error")(text).upper()


@dataclass(frozen=True)
class Option:
    """One declared key. ``field`` is the attribute of :class:`ArrowBeatConfig` it fills."""

    key: str
    field: str
    default: str
    expected: str
    doc: str
    parse: Callable[[str], Any]
    internal: bool = False  # set by arrowbeat itself, not by users


OPTIONS: tuple[Option, ...] = (
    Option(
        "spark.arrowbeat.python",
        "python",
        "",
        "a path to a Python 3.11+ interpreter",
        "Interpreter for arrowbeat's processes; empty means `PYSPARK_PYTHON`, then "
        "`spark.pyspark.python`. It must have arrowbeat installed. A relative path (`./env/bin/python` "
        "of `--archives env.tar.gz#env`) is resolved against the working directory of the process "
        "that launches it (an executor's own); an executor without it runs on without an agent.",
        _parse_str,
    ),
    Option(
        "spark.arrowbeat.driver.python",
        "driver_python",
        "",
        "a path to a Python 3.11+ interpreter",
        "Interpreter for arrowbeat's driver-side process; empty means `spark.arrowbeat.python`'s. Set "
        "it when that is a packed environment's path that only executors have (client mode).",
        _parse_str,
    ),
    Option(
        "spark.arrowbeat.startupTimeout",
        "startup_timeout_s",
        "30s",
        "a duration like 30s",
        "How long the JVM waits for an arrowbeat process to report ready before running on without it.",
        parse_duration,
    ),
    Option(
        "spark.arrowbeat.authenticate.secret",
        "secret",
        "",
        "a string of at least 16 characters",
        "Shared secret for every arrowbeat call (register, heartbeat, shuffle reads). Generated per "
        "application when unset; never logged. If you set it, set it in `spark-defaults.conf` or a "
        "`--properties-file`, not with `--conf` (every local user can read a command line).",
        _parse_str,
    ),
    Option(
        "spark.arrowbeat.rm.host",
        "rm_host",
        "",
        "a host name or IP address",
        "Address the ResourceManager binds to; empty means `spark.driver.host`.",
        _parse_host,
    ),
    Option(
        "spark.arrowbeat.rm.port",
        "rm_port",
        "0",
        "an integer port, 0 to 65535",
        "Port of the ResourceManager; 0 picks a free one.",
        _parse_int,
    ),
    Option(
        "spark.arrowbeat.rm.hangTimeout",
        "rm_hang_timeout_s",
        "0",
        "a duration like 10s, at least twice `heartbeat.interval`; 0 derives it",
        "The driver-side process (the ResourceManager) answers each of the driver JVM's pulses (one "
        "per heartbeat interval) from the RM's serving loop; left unanswered this long, it is hung: "
        "the JVM kills it (SIGKILL by pid) and starts it again. 0 means twice `heartbeat.timeout`, at "
        "least 5s: by then every agent has lost the RM anyway.",
        parse_duration,
    ),
    Option(
        "spark.arrowbeat.rm.restarts.max",
        "rm_restarts_max",
        "10",
        "an integer >= 1",
        "At most this many restarts of a dead or hung driver-side process start within any "
        "`rm.restarts.window` (a sliding window: a further restart waits until the oldest leaves it). "
        "Restarts never stop for good while the application runs.",
        _parse_int,
    ),
    Option(
        "spark.arrowbeat.rm.restarts.window",
        "rm_restarts_window_s",
        "10min",
        "a duration like 10min, at least 1s",
        "The sliding window of `rm.restarts.max`.",
        parse_duration,
    ),
    Option(
        "spark.arrowbeat.rm.restarts.backoffMax",
        "rm_restart_backoff_max_s",
        "30s",
        "a duration like 30s, between 100ms and 10min",
        "A restart of the driver-side process that failed (it did not report ready) is tried again "
        "after 1s, doubling per further failure up to this.",
        parse_duration,
    ),
    Option(
        "spark.arrowbeat.ui.enabled",
        "ui_enabled",
        "true",
        "true or false",
        "Serve the live page (executors' liveness, RTT, slots, memory, lifecycle events) over HTTP "
        "from the driver-side process, on the ResourceManager's host (HTTPS with its certificate when "
        "`spark.arrowbeat.ssl.enabled`). Its URL with the access token is logged at start-up; "
        "`spark.arrowbeat.ui.url` (no token) is set in the SparkConf.",
        parse_bool,
    ),
    Option(
        "spark.arrowbeat.ui.port",
        "ui_port",
        "0",
        "an integer port, 0 to 65535",
        "Port of the live page; 0 picks a free one.",
        _parse_int,
    ),
    Option(
        "spark.arrowbeat.heartbeat.interval",
        "heartbeat_interval_s",
        "1s",
        "a duration like 1s or 500ms",
        "How often the ResourceManager requests a heartbeat from each executor agent.",
        parse_duration,
    ),
    Option(
        "spark.arrowbeat.heartbeat.timeout",
        "heartbeat_timeout_s",
        "5s",
        "a duration like 5s",
        "An executor that has not answered for this long is reported HEARTBEAT_TIMEOUT. "
        "Must be larger than the interval.",
        parse_duration,
    ),
    Option(
        "spark.arrowbeat.heartbeat.rpcFailureThreshold",
        "rpc_failure_threshold",
        "2",
        "an integer >= 1, or -1 to disable",
        "Consecutive failed heartbeat RPCs after which an executor is reported UNREACHABLE.",
        _parse_int,
    ),
    Option(
        "spark.arrowbeat.heartbeat.detector",
        "heartbeat_detector",
        "timeout",
        "timeout or phi",
        "How the ResourceManager tells that an executor went silent. `timeout`: no answer for "
        "`heartbeat.timeout`. `phi`: also phi accrual over each executor's own answer intervals (as "
        "Akka's): it is reported HEARTBEAT_TIMEOUT once phi passes `heartbeat.phi.threshold`; a "
        "suspicion the RM's own stall could explain, or from a check that ran late, judges nothing, "
        "and `heartbeat.timeout` stays the longest silence. Its agent then goes silent at once when "
        "its JVM is stopped (SIGSTOP) but answers while the JVM runs without pulsing (a GC pause), "
        "up to `heartbeat.timeout`. With `heartbeat.interval=100ms` a stopped executor is reported "
        "in under a second (`benchmarks/detection_latency.py --part fast`).",
        _choice("timeout", "phi"),
    ),
    Option(
        "spark.arrowbeat.heartbeat.phi.threshold",
        "phi_threshold",
        "8",
        "a number > 0, at most 100, like 8",
        "With `heartbeat.detector=phi`: the phi at which an executor is suspected (8: a chance of "
        "about 1e-8 that an executor as steady as its history so far is alive). Lower reports "
        "sooner and risks false alarms.",
        _parse_float,
    ),
    Option(
        "spark.arrowbeat.heartbeat.phi.acceptablePause",
        "phi_acceptable_pause_s",
        "200ms",
        "a duration like 200ms, below `heartbeat.timeout`",
        "With `heartbeat.detector=phi`: a silence this much longer than an executor's usual interval "
        "is not counted against it (the margin for a late answer from a loaded host).",
        parse_duration,
    ),
    Option(
        "spark.arrowbeat.heartbeat.registrationBackoff.min",
        "registration_backoff_min_s",
        "100ms",
        "a duration like 100ms, at least 1ms",
        "First delay before an executor agent registers with the ResourceManager again after a "
        "failed attempt; each further delay doubles (with jitter) up to "
        "`heartbeat.registrationBackoff.max`. Agents never stop trying while their executor runs.",
        parse_duration,
    ),
    Option(
        "spark.arrowbeat.heartbeat.registrationBackoff.max",
        "registration_backoff_max_s",
        "5s",
        "a duration like 5s, at least `heartbeat.registrationBackoff.min`, at most 10min",
        "Longest delay between an executor agent's registration attempts: after the "
        "ResourceManager was down or frozen, every agent is registered again within about this "
        "plus one heartbeat interval once it answers.",
        parse_duration,
    ),
    Option(
        "spark.arrowbeat.tables.path",
        "tables_path",
        "",
        "a directory path (`file:` too), or `s3a://bucket/path`, "
        "`abfss://container@account.dfs.core.windows.net/path`, `gs://bucket/path`, `hdfs://host/path`",
        "Where the Delta history tables (heartbeats, executor_events, shuffle_metrics) live; empty means "
        "an `arrowbeat` folder under `spark.sql.warehouse.dir`. On a cluster, storage every reader "
        "sees: a shared mount or an object store. The driver-side process writes with delta-rs, "
        "taking credentials and endpoint from the application's `spark.hadoop.fs.s3a.*`, "
        "`spark.hadoop.fs.azure.account.key.<account>.dfs.core.windows.net` or "
        "`spark.hadoop.google.cloud.auth.service.account.json.keyfile` (never logged); Spark's readers "
        "use the URI as written (`s3a://` needs Spark's `hadoop-aws` jars).",
        _parse_str,
    ),
    Option(
        "spark.arrowbeat.tables.flushInterval",
        "tables_flush_interval_s",
        "2s",
        "a duration like 2s",
        "At most one commit per table per interval; rows are readable within about this long.",
        parse_duration,
    ),
    Option(
        "spark.arrowbeat.tables.compactInterval",
        "tables_compact_interval_s",
        "1min",
        "a duration like 1min",
        "How often small files are compacted, the log checkpointed and removed files vacuumed.",
        parse_duration,
    ),
    Option(
        "spark.arrowbeat.tables.retention",
        "tables_retention_s",
        "1h",
        "a duration like 1h, at least 1min",
        "How long compacted-away files and old log entries stay before vacuum removes them: bounds "
        "each table to about this long's commits; a streaming reader may lag at most this long.",
        parse_duration,
    ),
    Option(
        "spark.arrowbeat.onHeartbeatTimeout",
        "on_heartbeat_timeout",
        "record",
        "record or kill",
        "What a heartbeat timeout does besides being recorded: `kill` asks Spark to kill and "
        "replace the executor and tells Spark's scheduler it is lost (its running tasks rerun at "
        "once), and the executor's agent SIGKILLs its JVM if it finds it stopped; a silence the "
        "RM's own stall explains is not judged (watched again from then).",
        _choice("record", "kill"),
    ),
    Option(
        "spark.arrowbeat.stuckTask.timeout",
        "stuck_task_timeout_s",
        "10min",
        "a duration like 10min, 30s; 0 turns it off",
        "A running task whose threads (its JVM thread and its Python worker) use no CPU for this "
        "long is recorded as `TASK_STUCK` in `executor_events`, with where it waits (its stacks); a "
        "slow but busy task never is. Python stacks and worker CPU need arrowbeat's worker daemon "
        "(`spark.python.daemon.module`, set by `conf` when the workers run arrowbeat's Python).",
        parse_duration,
    ),
    Option(
        "spark.arrowbeat.onStuckTask",
        "on_stuck_task",
        "record",
        "record or kill",
        "What a stuck task does besides being recorded: `kill` asks Spark to kill that task "
        "attempt (`SparkContext.killTaskAttempt`), which Spark then runs again.",
        _choice("record", "kill"),
    ),
    Option(
        "spark.arrowbeat.onDegraded",
        "on_degraded",
        "report",
        "report or exclude",
        "What an executor consistently slower than its peers (`DEGRADED`: its JVM cannot run when it "
        "should, compared like with like, never because it is busier) does besides being recorded: "
        "`exclude` asks Spark to stop using it and replace it: decommissioned where "
        "`spark.decommission.enabled` is on (no new task goes there; with `spark.storage.decommission.*` "
        "its shuffle and cached blocks move), else killed and replaced (its running tasks rerun "
        "elsewhere); one executor at a time, never the last healthy one.",
        _choice("report", "exclude"),
    ),
    Option(
        "spark.arrowbeat.log.level",
        "log_level",
        "info",
        "one of debug, info, warning, error",
        "Log level of arrowbeat's processes (their output goes to the driver/executor log).",
        _log_level,
    ),
    Option(
        "spark.arrowbeat.shuffle.dir",
        "shuffle_dir",
        "",
        "a local directory path",
        "Root of the Arrow shuffle's map-output files on every executor (and of the agents' discovery "
        "files), overriding the default: empty means each executor's own Spark local directories "
        "(`spark.local.dir`, `SPARK_LOCAL_DIRS`, YARN's `LOCAL_DIRS`, a Worker's dirs, as Spark resolved "
        "them), where Spark keeps its shuffle files; map outputs are spread over all of them. When set, "
        "it must be a path every executor host has. Created 0700 if absent; refused (the error names it) "
        "if it is a symlink, owned by another user or writable by group or others.",
        _parse_str,
    ),
    Option(
        "spark.arrowbeat.shuffle.port",
        "shuffle_port",
        "0",
        "an integer port, 0 to 65535",
        "First port the executor agents' shuffle servers bind (for firewalls): each agent takes the "
        "first free one from here for data and the next free one for control, trying 32 ports (so up "
        "to 16 executors per host); 0 picks free ports.",
        _parse_int,
    ),
    Option(
        "spark.arrowbeat.shuffle.ttl",
        "shuffle_ttl_s",
        "1h",
        "a duration like 1h",
        "An agent deletes a shuffle's map outputs that nobody released after this long untouched (on "
        "its monotonic clock); the driver forgets a pipelined shuffle's rendezvous entries as long "
        "after their last use (tasks killed before they could unregister).",
        parse_duration,
    ),
    Option(
        "spark.arrowbeat.shuffle.mapMemory",
        "shuffle_map_memory_bytes",
        "8m",
        "a size like 32m",
        "Memory a map task buffers before writing a run of its output to disk (bounds the task's memory: "
        "writing a run takes a quarter of it again plus its largest column).",
        parse_bytes,
    ),
    Option(
        "spark.arrowbeat.shuffle.reduceMemory",
        "shuffle_reduce_memory_bytes",
        "512m",
        "a size like 512m, 1m to 1t",
        "Rows a reduce task of a grouped call (`group_apply`, the `applyInPandas`/`applyInArrow` "
        "take-overs, cogroups) holds in memory; past this it spills its partition to the executor's "
        "local dirs in hash buckets of whole key groups and runs the function a bucket at a time, so "
        "a partition larger than memory completes. One key group larger than this is still handed "
        "over whole (memory-mapped from disk), as Spark hands one group at a time to `applyInPandas`. "
        "Settable per query.",
        parse_bytes,
    ),
    Option(
        "spark.arrowbeat.shuffle.agentMemory",
        "shuffle_agent_memory_bytes",
        "32m",
        "a size like 32m",
        "Network buffer memory of each executor agent's shuffle server (streams to remote reducers).",
        parse_bytes,
    ),
    Option(
        "spark.arrowbeat.shuffle.bufferReserveTimeout",
        "shuffle_buffer_reserve_timeout_s",
        "5min",
        "a duration like 5min, at most 1d",
        "How long a stream an executor agent serves to a remote reducer may queue for its minimum of "
        "network buffers from `shuffle.agentMemory` (first come, first served) before the reducer is "
        "told it got none (a task failure that Spark retries). Raise it, or `shuffle.agentMemory`, "
        "when many reducers read one executor at once.",
        parse_duration,
    ),
    Option(
        "spark.arrowbeat.shuffle.directScan",
        "shuffle_direct_scan",
        "true",
        "true or false",
        "A shuffle whose input is nothing but Parquet files (`spark.read.parquet(...)`, a `select` of "
        "its columns) on the local file system has its map tasks read the files with pyarrow instead "
        "of taking Spark's scan's rows through the JVM (`spark_plugin.shuffle.driver.direct_scan`): same "
        "rows, one conversion fewer. Only where every column reads as the Arrow type Spark would "
        "hand a Python worker; anything else keeps Spark's scan. Settable per query with "
        "`spark.conf.set`.",
        parse_bool,
    ),
    Option(
        "spark.arrowbeat.shuffle.adaptive",
        "shuffle_adaptive",
        "auto",
        "auto, true or false",
        "Coalesce contiguous reduce partitions of `group_apply`, `partition_apply` and `repartition` "
        "without an explicit partition count up to a target size once the map side has run "
        "(arrowbeat's counterpart of AQE's partition coalescing). `auto` follows "
        "`spark.sql.adaptive.enabled` and `spark.sql.adaptive.coalescePartitions.enabled`. The "
        "target follows `spark.sql.adaptive.advisoryPartitionSizeInBytes`, "
        "`...coalescePartitions.minPartitionSize`, `...parallelismFirst` and `...minPartitionNum`, "
        "as Spark's coalescing does. With `auto`, an input the optimizer sizes at most the "
        "advisory size x the default parallelism (and whose plan cannot grow rows) is planned "
        "from that size with no map job run first; `true` always measures the real sizes. "
        "Settable per query.",
        _choice("auto", "true", "false"),
    ),
    Option(
        "spark.arrowbeat.shuffle.readHostLocalDisk",
        "shuffle_read_host_local",
        "true",
        "true or false",
        "Reduce tasks read map outputs of other executors on the same host straight from disk (like "
        "`spark.shuffle.readHostLocalDisk`) instead of streaming them through their agent. Settable "
        "per query with `spark.conf.set`.",
        parse_bool,
    ),
    Option(
        "spark.arrowbeat.shuffle.checksum",
        "shuffle_checksum",
        "true",
        "true or false",
        "Map tasks write a checksum (XXH3) of every 1 MiB of each map-output segment beside its index, and "
        "every reader (a host-local file read, the agent serving a stream) verifies it before Arrow "
        "decodes a byte; the shuffle channel checksums each network frame. Damaged bytes are a lost "
        "map output that Spark recomputes (a `SHUFFLE_CORRUPT` event, `corrupt` in "
        "`shuffle_metrics`), never a wrong answer or a crashed worker. Off, only decoding guards "
        "the files. One setting for the whole application: a frame's sender and reader must agree.",
        parse_bool,
    ),
    Option(
        "spark.arrowbeat.shuffle.path",
        "shuffle_path",
        "",
        "auto, arrowbeat or spark (unset: the caller's default)",
        "Which exchange `group_apply`, `partition_apply` and `repartition` (and the grouped-map "
        "calls arrowbeat takes over) use: `arrowbeat` forces arrowbeat's shuffle, `spark` Spark's own "
        "(`groupBy(...).applyInArrow`, `repartition(...).mapInArrow`), `auto` decides per call from "
        "the optimizer's size statistics of the input (a cached relation's real size once "
        "materialized): Spark's path below a size measured on a 2-core machine "
        "(`spark_plugin.shuffle.driver.route`), arrowbeat's above it or without statistics (Spark Connect). "
        "Unset: the explicit calls use arrowbeat's, `shuffle.groupedMap=auto` decides as `auto`. A "
        "call's `path=` argument wins. Each choice and its reason is a `shuffle_metrics` row (side "
        "`route`). Settable per query with `spark.conf.set`.",
        _choice("", "auto", "arrowbeat", "spark"),
    ),
    Option(
        "spark.arrowbeat.shuffle.groupedMap",
        "shuffle_grouped_map",
        "auto",
        "off, on or auto",
        "Runs the application's own `df.groupBy(...).applyInPandas/applyInArrow` and "
        "`cogroup(...).applyInPandas/applyInArrow` on arrowbeat's shuffle, no code change (a hook "
        "the wheel installs wraps PySpark's methods; `off` calls Spark's own after one conf lookup). "
        "`auto` (the default): only where arrowbeat's shuffle is expected to be faster for the "
        "input, and only where the plugin is on. Calls and forms it does not take over run on "
        "Spark's path with one log line saying why (WARNING where the key is set, INFO under the "
        "default). Read at each call: settable per query with `spark.conf.set`.",
        _choice("off", "on", "auto"),
    ),
    Option(
        "spark.arrowbeat.ssl.enabled",
        "ssl_enabled",
        "false",
        "true or false",
        "Encrypts arrowbeat's gRPC calls and shuffle streams with TLS (1.2 or later), as "
        "`spark.ssl.rpc.enabled` does Spark's RPC. Without `ssl.certChain`/`ssl.privateKey` the "
        "driver-side process generates a self-signed certificate per application and every executor "
        "trusts that one certificate only (it travels with the secret, never through a file).",
        parse_bool,
    ),
    Option(
        "spark.arrowbeat.ssl.privateKey",
        "ssl_private_key",
        "",
        "a path to an unencrypted PEM private key",
        "Private key of `ssl.certChain`, as `spark.ssl.rpc.privateKey`; set both or neither (neither: "
        "a generated certificate). The file must be readable on the driver and on every executor "
        "host; keep it 0600.",
        _parse_str,
    ),
    Option(
        "spark.arrowbeat.ssl.certChain",
        "ssl_cert_chain",
        "",
        "a path to a PEM certificate chain, server certificate first",
        "Certificate chain the RM and the shuffle agents present, as `spark.ssl.rpc.certChain`. Its "
        "first certificate needs a DNS subjectAltName: clients check it against `ssl.serverName`, "
        "not against the host they connect to. Must be readable on the driver and every executor host.",
        _parse_str,
    ),
    Option(
        "spark.arrowbeat.ssl.trustStore",
        "ssl_trust_store",
        "",
        "a path to a PEM bundle of certificates",
        "Certificates clients trust, a PEM bundle (where `spark.ssl.rpc.trustStore` is a Java key "
        "store); any listed certificate is an anchor, an intermediate too; empty pins the first "
        "certificate of `ssl.certChain`. Only with `ssl.certChain`: a generated certificate is always "
        "pinned.",
        _parse_str,
    ),
    Option(
        "spark.arrowbeat.ssl.serverName",
        "ssl_server_name",
        "",
        "a DNS name without wildcard",
        "Name clients require in the server's certificate. Empty: `arrowbeat` for the generated "
        "certificate and for a `ssl.certChain` that lists `DNS:arrowbeat`, else the first DNS "
        "subjectAltName of its first certificate (`*.example.com` gives `arrowbeat.example.com`). "
        "With one certificate per host, give each the same extra name (e.g. `DNS:arrowbeat`).",
        _parse_server_name,
    ),
    Option(
        "spark.arrowbeat.rm.address",
        "rm_address",
        "",
        "host:port",
        "Set by arrowbeat on the driver: where the ResourceManager listens.",
        _parse_address,
        internal=True,
    ),
    Option(
        "spark.arrowbeat.ui.url",
        "ui_url",
        "",
        "an http:// URL",
        "Set by arrowbeat on the driver: the live page's address, without its access token.",
        _parse_str,
        internal=True,
    ),
    Option(
        "spark.arrowbeat.driver.pid",
        "driver_pid",
        "0",
        "an integer",
        "Set by arrowbeat on the driver: pid of the driver-side process.",
        _parse_int,
        internal=True,
    ),
    Option(
        "spark.arrowbeat.ssl.generatedCert",
        "ssl_generated_cert",
        "",
        "one line of base64 (a DER certificate)",
        "Set by arrowbeat: the certificate the driver-side process generated (`ssl.enabled` without "
        "files), handed to the executors with the secret; executors trust it alone.",
        _parse_base64_line,
        internal=True,
    ),
    Option(
        "spark.arrowbeat.ssl.generatedKeySecret",
        "ssl_generated_key",
        "",
        "one line of base64 (a DER PKCS#8 private key)",
        "Set by arrowbeat: the generated certificate's private key. Its name contains `secret` so "
        "Spark's `spark.redaction.regex` and arrowbeat's log filters redact its value.",
        _parse_base64_line,
        internal=True,
    ),
)

OPTIONS_BY_KEY: dict[str, Option] = {o.key: o for o in OPTIONS}
_OPTIONS_BY_FIELD: dict[str, Option] = {o.field: o for o in OPTIONS}


def key_of(field_name: str) -> str:
    """The key that fills ``ArrowBeatConfig.<field_name>``: code that names a key in a message
    (``settings.tls``) takes it from here, so each key's string is written once, in :data:`OPTIONS`."""
    return _OPTIONS_BY_FIELD[field_name].key


@dataclass(frozen=True)
class ArrowBeatConfig:
    """Parsed, validated settings; one attribute per :data:`OPTIONS` entry."""

    python: str
    driver_python: str
    startup_timeout_s: float
    secret: str = field(repr=False)
    """Never in ``repr``/``str`` (nor, by the plugin, in any log, argv, environment or file)."""
    rm_host: str
    rm_port: int
    rm_hang_timeout_s: float
    rm_restarts_max: int
    rm_restarts_window_s: float
    rm_restart_backoff_max_s: float
    ui_enabled: bool
    ui_port: int
    heartbeat_interval_s: float
    heartbeat_timeout_s: float
    rpc_failure_threshold: int
    heartbeat_detector: str
    phi_threshold: float
    phi_acceptable_pause_s: float
    registration_backoff_min_s: float
    registration_backoff_max_s: float
    tables_path: str
    tables_flush_interval_s: float
    tables_compact_interval_s: float
    tables_retention_s: float
    on_heartbeat_timeout: str
    stuck_task_timeout_s: float
    on_stuck_task: str
    on_degraded: str
    log_level: str
    shuffle_dir: str
    shuffle_port: int
    shuffle_ttl_s: float
    shuffle_map_memory_bytes: int
    shuffle_reduce_memory_bytes: int
    shuffle_agent_memory_bytes: int
    shuffle_buffer_reserve_timeout_s: float
    shuffle_read_host_local: bool
    shuffle_checksum: bool
    shuffle_direct_scan: bool
    shuffle_adaptive: str
    shuffle_path: str
    shuffle_grouped_map: str
    ssl_enabled: bool
    ssl_private_key: str
    ssl_cert_chain: str
    ssl_trust_store: str
    ssl_server_name: str
    rm_address: str
    ui_url: str
    driver_pid: int
    ssl_generated_cert: str = field(repr=False)
    ssl_generated_key: str = field(repr=False)
    """The generated TLS material (``spark_plugin.settings.tls``): never in ``repr``, errors or logs."""

    def rm_hang_bound_s(self) -> float:
        """How long the driver-side process may leave a pulse unanswered before the JVM calls it
        hung: ``rm.hangTimeout``, or twice ``heartbeat.timeout`` and at least 5 s."""
        return self.rm_hang_timeout_s or max(2 * self.heartbeat_timeout_s, 5.0)

    def agent_hang_bound_s(self) -> float:
        """How long an executor's agent may leave its JVM's pulse unanswered before the JVM calls
        it hung, kills and restarts it: twice ``heartbeat.timeout`` and at least 5 s (no key of its
        own). By then a wedged agent has missed the RM's heartbeats for a whole timeout, so the
        kill never comes before the RM saw the silence, and a short stall is never fatal."""
        return max(2 * self.heartbeat_timeout_s, 5.0)

    def heartbeat_services(self) -> HeartbeatServices:
        """The heartbeat library's settings object, built from the ``heartbeat.*`` keys (with the
        phi detector's settings when ``heartbeat.detector=phi``).

        The library validates again on construction; :func:`load` has already checked the same
        rules (``0 < interval < timeout``, threshold >= 1 or -1) and named the Spark keys."""
        from heartbeat.phi_accrual import PhiSettings
        from heartbeat.services import HeartbeatServices

        phi = None
        if self.heartbeat_detector == "phi":
            phi = PhiSettings.for_interval(
                self.heartbeat_interval_s, self.phi_threshold, self.phi_acceptable_pause_s
            )
        return HeartbeatServices(
            interval_s=self.heartbeat_interval_s,
            timeout_s=self.heartbeat_timeout_s,
            rpc_failure_threshold=self.rpc_failure_threshold,
            phi=phi,
        )

    def registration_policy(self) -> RetryPolicy:
        """How an executor's agent retries registering: capped, jittered exponential backoff from
        the two ``heartbeat.registrationBackoff.*`` keys, with no deadline (it tries for as long as
        its executor lives; ``load`` checked the range); each attempt bounded by the heartbeat
        timeout, so a frozen RM costs one timeout per attempt, not a hang."""
        from heartbeat.retry import RetryPolicy

        return RetryPolicy(
            min_delay_s=self.registration_backoff_min_s,
            max_delay_s=self.registration_backoff_max_s,
            deadline_s=None,
            attempt_timeout_s=max(0.5, self.heartbeat_timeout_s),
        )


def _check_ranges(c: ArrowBeatConfig) -> list[str]:
    problems: list[str] = []
    if c.startup_timeout_s <= 0:
        problems.append("spark.arrowbeat.startupTimeout must be > 0")
    if c.secret and len(c.secret) < 16:
        problems.append("spark.arrowbeat.authenticate.secret must have at least 16 characters")
    for key, port in (("rm.port", c.rm_port), ("shuffle.port", c.shuffle_port), ("ui.port", c.ui_port)):
        if not 0 <= port <= 65535:
            problems.append(f"spark.arrowbeat.{key}={port}: expected an integer port, 0 to 65535")
    if c.heartbeat_interval_s <= 0:
        problems.append("spark.arrowbeat.heartbeat.interval must be > 0")
    if c.heartbeat_interval_s >= c.heartbeat_timeout_s:
        problems.append(
            f"spark.arrowbeat.heartbeat.interval ({c.heartbeat_interval_s:g}s) must be smaller than "
            f"spark.arrowbeat.heartbeat.timeout ({c.heartbeat_timeout_s:g}s)"
        )
    if not 0 < c.phi_threshold <= 100:
        problems.append(f"{key_of('phi_threshold')}={c.phi_threshold:g}: expected a number > 0, at most 100")
    if not 0 <= c.phi_acceptable_pause_s < c.heartbeat_timeout_s:
        problems.append(
            f"{key_of('phi_acceptable_pause_s')} ({c.phi_acceptable_pause_s:g}s) must be below "
            f"{key_of('heartbeat_timeout_s')} ({c.heartbeat_timeout_s:g}s)"
        )
    backoff_min, backoff_max = key_of("registration_backoff_min_s"), key_of("registration_backoff_max_s")
    if c.registration_backoff_min_s < 0.001:
        problems.append(f"{backoff_min} ({c.registration_backoff_min_s:g}s): expected at least 1ms")
    if not c.registration_backoff_min_s <= c.registration_backoff_max_s <= 600:
        problems.append(
            f"{backoff_max} ({c.registration_backoff_max_s:g}s): expected at least {backoff_min} "
            f"({c.registration_backoff_min_s:g}s) and at most 10min"
        )
    if c.rm_hang_timeout_s and c.rm_hang_timeout_s < 2 * c.heartbeat_interval_s:
        problems.append(
            f"{key_of('rm_hang_timeout_s')} ({c.rm_hang_timeout_s:g}s) must be 0 or at least twice "
            f"spark.arrowbeat.heartbeat.interval ({c.heartbeat_interval_s:g}s)"
        )
    if c.rm_restarts_max < 1:
        problems.append(f"{key_of('rm_restarts_max')}={c.rm_restarts_max}: expected an integer >= 1")
    if c.rm_restarts_window_s < 1:
        problems.append(f"{key_of('rm_restarts_window_s')} ({c.rm_restarts_window_s:g}s) must be at least 1s")
    if not 0.1 <= c.rm_restart_backoff_max_s <= 600:
        problems.append(
            f"{key_of('rm_restart_backoff_max_s')} ({c.rm_restart_backoff_max_s:g}s) must be between 100ms "
            "and 10min"
        )
    if c.tables_flush_interval_s <= 0:
        problems.append("spark.arrowbeat.tables.flushInterval must be > 0")
    if c.tables_compact_interval_s < c.tables_flush_interval_s:
        problems.append("spark.arrowbeat.tables.compactInterval must not be below tables.flushInterval")
    if c.tables_retention_s < 60:
        problems.append(f"spark.arrowbeat.tables.retention ({c.tables_retention_s:g}s) must be at least 1min")
    if c.shuffle_ttl_s <= 0:
        problems.append("spark.arrowbeat.shuffle.ttl must be > 0")
    if not 1 << 20 <= c.shuffle_map_memory_bytes <= 1 << 40:
        problems.append("spark.arrowbeat.shuffle.mapMemory must be between 1m and 1t")
    if not 1 << 20 <= c.shuffle_reduce_memory_bytes <= 1 << 40:
        problems.append("spark.arrowbeat.shuffle.reduceMemory must be between 1m and 1t")
    if not 4 << 20 <= c.shuffle_agent_memory_bytes <= 1 << 40:
        problems.append("spark.arrowbeat.shuffle.agentMemory must be between 4m and 1t")
    if not 0.001 <= c.shuffle_buffer_reserve_timeout_s <= 86400:  # the engine's own range
        problems.append(
            f"spark.arrowbeat.shuffle.bufferReserveTimeout ({c.shuffle_buffer_reserve_timeout_s:g}s) "
            "must be between 1ms and 1d"
        )
    if c.rpc_failure_threshold < 1 and c.rpc_failure_threshold != -1:
        problems.append(
            f"spark.arrowbeat.heartbeat.rpcFailureThreshold={c.rpc_failure_threshold}: "
            "expected an integer >= 1, or -1 to disable"
        )
    return problems


def _readable_file_problem(key: str, path: str) -> str | None:
    """Why ``path`` cannot serve as the PEM file of ``key``, or None. A regular file (symlinks are
    followed: mounted Kubernetes secrets are links) is required, so a FIFO cannot stall start-up."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        return f"{key}={path!r}: cannot read the file ({exc.strerror or exc})"
    if not stat.S_ISREG(mode):
        return f"{key}={path!r}: not a regular file"
    if not os.access(path, os.R_OK):
        return f"{key}={path!r}: the file is not readable by this user"
    return None


def _check_ssl(c: ArrowBeatConfig) -> list[str]:
    """The ``ssl.*`` keys, checked only when TLS is on (as Spark checks ``spark.ssl.*``). The
    files' contents (PEM, key matching the certificate, trust) are checked by ``spark_plugin.settings.tls``
    when the processes load them, still at start-up."""
    if not c.ssl_enabled:
        return []
    problems: list[str] = []
    key, chain, trust = key_of("ssl_private_key"), key_of("ssl_cert_chain"), key_of("ssl_trust_store")
    if bool(c.ssl_private_key) != bool(c.ssl_cert_chain):
        problems.append(
            f"{key} and {chain} must be set together (both empty: a certificate is generated per application)"
        )
    if c.ssl_trust_store and not c.ssl_cert_chain:
        problems.append(
            f"{trust} is set without {chain}: the generated certificate is pinned and trusts nothing else"
        )
    for name, path in ((key, c.ssl_private_key), (chain, c.ssl_cert_chain), (trust, c.ssl_trust_store)):
        if path and (problem := _readable_file_problem(name, path)):
            problems.append(problem)
    if c.ssl_server_name and not c.ssl_cert_chain:
        problems.append(
            f"{key_of('ssl_server_name')} is set without {chain}: the generated certificate's name "
            "is always `arrowbeat`"
        )
    generated = (key_of("ssl_generated_cert"), key_of("ssl_generated_key"))
    if bool(c.ssl_generated_cert) != bool(c.ssl_generated_key):
        problems.append(f"{generated[0]} and {generated[1]} must be handed over together")
    if c.ssl_generated_cert and c.ssl_cert_chain:
        problems.append(f"{generated[0]} is set although {chain} is configured: the launcher is out of step")
    return problems


def _check_tables(c: ArrowBeatConfig) -> list[str]:
    problem = tables_path_problem("spark.arrowbeat.tables.path", c.tables_path)
    return [problem] if problem else []


_REDACTED_FIELDS = frozenset({"secret", "ssl_generated_cert", "ssl_generated_key"})
"""Fields whose values no error message shows (the certificate too: it is not secret, but a
malformed one may be a key pasted into the wrong setting)."""


def load(settings: Mapping[str, str]) -> ArrowBeatConfig:
    """Parses every ``spark.arrowbeat.*`` entry of ``settings``; other keys are ignored."""
    problems: list[str] = []
    for key in settings:
        if key.startswith(PREFIX) and key not in OPTIONS_BY_KEY:
            problems.append(f"unknown key {key} (known keys: see `python -m spark_plugin config-docs`)")
    values: dict[str, Any] = {}
    for option in OPTIONS:
        text = settings.get(option.key, option.default)
        try:
            values[option.field] = option.parse(text)
        except ValueError:
            shown = "<redacted>" if option.field in _REDACTED_FIELDS else repr(text)
            problems.append(f"{option.key}={shown}: expected {option.expected}")
            values[option.field] = option.parse(option.default)
    config = ArrowBeatConfig(**values)
    problems.extend(_check_ranges(config))
    problems.extend(_check_ssl(config))
    problems.extend(_check_tables(config))
    if problems:
        raise ConfigError(problems)
    return config


def declared_default(key: str) -> Any:
    """A key's declared default, parsed: for library defaults that must agree with the config."""
    option = OPTIONS_BY_KEY[key]
    return option.parse(option.default)


def early_value(settings: Mapping[str, str], key: str) -> Any:
    """One declared key's parsed value, before :func:`load` has validated the whole config (the
    log level, so that load's own problems get logged): a malformed value gives the declared
    default here, and :func:`load` reports it."""
    option = OPTIONS_BY_KEY[key]
    try:
        return option.parse(settings.get(key, option.default))
    except ValueError:
        return declared_default(key)


def from_spark_conf(
    entries: Iterable[tuple[str, str]], overrides: Mapping[str, str] | None = None
) -> ArrowBeatConfig:
    """The settings of a running application, as its driver sees them.

    ``entries`` is ``SparkConf.getAll()`` (the application's conf); ``overrides`` the session's
    runtime conf (``spark.conf``), whose ``spark.arrowbeat.*`` values win, so a key documented as
    settable per query takes effect. Keys outside ``spark.arrowbeat.*`` are ignored; everything
    is parsed and validated through :data:`OPTIONS` (raises :class:`ConfigError`)."""
    settings = {key: value for key, value in entries if key.startswith(PREFIX)}
    for key, value in (overrides or {}).items():
        if key.startswith(PREFIX) and value is not None:
            settings[key] = value
    return load(settings)


def docs_table() -> str:
    """The table of user-facing keys (the site's configuration reference), from :data:`OPTIONS`."""
    rows = ["| key | default | expected | meaning |", "| --- | --- | --- | --- |"]
    for o in OPTIONS:
        if not o.internal:
            default = f"`{o.default}`" if o.default else "(unset)"
            rows.append(f"| `{o.key}` | {default} | {o.expected} | {o.doc} |")
    return "\n".join(rows)
