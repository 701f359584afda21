"""The ``arrowbeat`` command: what an operator runs in a terminal.

::

    arrowbeat conf [...]                                   spark-submit flags (python -m spark_plugin conf)
    arrowbeat executors --rm HOST:PORT [--watch [S]]        the RM's live view (ListExecutors)
    arrowbeat events --tables PATH [--app ID] [--follow]    lifecycle events from executor_events
    arrowbeat degraded --tables PATH [--app ID]             executors slower than their peers now
    arrowbeat tables describe|compact|vacuum --tables PATH  the history tables' upkeep
    arrowbeat report --tables PATH --app ID -o FILE.html    one application's liveness history

The secret (``executors``) comes from the ``ARROWBEAT_SECRET`` environment variable or
``--secret-file`` (owner-only; ``-`` reads a line from stdin), the rules of
``heartbeat.agent.main``: never from argv, where every user of the host could read it. An RM
with ``spark.arrowbeat.ssl.enabled=true`` answers only over TLS: ``--ca-file`` gives the
certificate to trust (a PEM file, or the one-line ``spark.arrowbeat.ssl.generatedCert`` value of
the application's SparkConf).

Exit status: 0 done; 1 the work failed (RM unreachable or refusing the secret, a table missing,
an unknown application); 2 a usage error (arguments, the secret's source). Failures are one
``arrowbeat: ...`` line on stderr saying what to do, no traceback. ``--follow`` and ``--watch``
run until SIGINT or SIGTERM and then exit 0.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from heartbeat import one_line
from heartbeat.errors import HeartbeatAuthenticationError, HeartbeatError, ProtocolVersionError
from spark_plugin.errors import PluginError, UnknownApplicationError
from spark_plugin.history import EXECUTOR_EVENTS, HEARTBEATS, TablesLocation, locate
from spark_plugin.history.event_lines import format_event
from spark_plugin.history.reader import has_table, open_history_table, read_rows, resolve_app
from spark_plugin.history.recovery import DEGRADED_ENDS
from spark_plugin.history.tables import SHUFFLE_METRICS
from spark_plugin.history.wire_text import MAX_ERROR_CHARS
from spark_plugin.settings import extras
from spark_plugin.tools.report import DEFAULT_TIMEOUT_S, write_report
from spark_plugin.tools.views import executor_rows, size_text

if TYPE_CHECKING:
    import grpc

    from heartbeat.executor_info import ExecutorInfo

USAGE, FAILED = 2, 1
_ADDRESS = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")
HISTORY_TABLES = (HEARTBEATS.name, EXECUTOR_EVENTS.name, SHUFFLE_METRICS.name)


class CliError(Exception):
    """A failure to report as one line; ``code`` is the exit status."""

    def __init__(self, message: str, code: int = FAILED) -> None:
        super().__init__(message)
        self.code = code


class RmUnreachableError(CliError):
    """No answer from the RM in time: ``--watch`` says so and tries again (the application may
    be starting or ending); any other failure ends the command."""


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["conf"]:  # the same command, its own options and output
        from spark_plugin.tools.conf_command import main as module_main

        return module_main(args_list)
    if any(re.match(r"--sec(r(e(t)?)?)?(=|$)", a) for a in args_list):
        print(
            "arrowbeat: the secret is never taken from the command line (every user of this host can "
            "read it there): set ARROWBEAT_SECRET or pass --secret-file",
            file=sys.stderr,
        )
        return USAGE
    args = _parser().parse_args(args_list)
    try:
        result: int = args.run(args)
        return result
    except CliError as exc:
        print(f"arrowbeat: {exc}", file=sys.stderr)
        return exc.code
    except (PluginError, HeartbeatError) as exc:  # named and scrubbed where raised
        print(f"arrowbeat: {exc}", file=sys.stderr)
        return FAILED
    except BrokenPipeError:  # `arrowbeat events | head`
        with contextlib.suppress(OSError):
            sys.stdout.close()
        return 0


def _parser() -> argparse.ArgumentParser:
    # No abbreviations: `--secret X` must not be taken for `--secret-file X` (a secret in argv).
    parser = argparse.ArgumentParser(
        prog="arrowbeat",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser(
        "conf",
        allow_abbrev=False,
        help="print the spark-submit flags that turn arrowbeat on (see `conf --help`)",
    )

    ex = sub.add_parser(
        "executors", allow_abbrev=False, help="the RM's live view of the executors (ListExecutors)"
    )
    ex.add_argument("--rm", required=True, metavar="HOST:PORT", help="spark.arrowbeat.rm.address of the app")
    ex.add_argument(
        "--watch", nargs="?", type=_positive, const=2.0, metavar="SECONDS", help="refresh every SECONDS (2)"
    )
    ex.add_argument("--timeout", type=_positive, default=5.0, help="deadline of one call, seconds (5)")
    ex.add_argument("--json", action="store_true", help="one JSON array per refresh instead of a table")
    _add_secret_args(ex)
    ex.set_defaults(run=_executors)

    ev = sub.add_parser(
        "events", allow_abbrev=False, help="lifecycle events of executors (executor_events table)"
    )
    _add_tables_arg(ev)
    ev.add_argument("--app", help="one application's events (an id, or `latest`); default: all")
    ev.add_argument("--follow", action="store_true", help="keep printing new events until interrupted")
    ev.add_argument("--interval", type=_positive, default=1.0, help="--follow's polling interval, seconds")
    ev.set_defaults(run=_events)

    dg = sub.add_parser(
        "degraded",
        allow_abbrev=False,
        help="executors recorded DEGRADED (slower than their peers) and not since recovered or gone",
    )
    _add_tables_arg(dg)
    dg.add_argument("--app", default="latest", help="the application id, or `latest` (the default)")
    dg.set_defaults(run=_degraded)

    tb = sub.add_parser("tables", allow_abbrev=False, help="describe, compact or vacuum the history tables")
    tb.add_argument("action", choices=("describe", "compact", "vacuum"))
    _add_tables_arg(tb)
    tb.add_argument(
        "--dry-run", action="store_true", help="vacuum: list what would be removed, remove nothing"
    )
    tb.set_defaults(run=_tables)

    rp = sub.add_parser(
        "report", allow_abbrev=False, help="an HTML report of one application's liveness history"
    )
    _add_tables_arg(rp)
    rp.add_argument("--app", required=True, help="the application id, or `latest` (the last one to start)")
    rp.add_argument("-o", "--output", required=True, type=Path, help="the HTML file to write")
    rp.add_argument(
        "--timeout",
        type=_positive,
        help="heartbeat timeout to judge gaps by, seconds (default: the default, 5)",
    )
    rp.add_argument("--max-plots", type=int, default=64, help="plot at most this many executors (64)")
    rp.set_defaults(run=_report)
    return parser


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
    return value


def _add_secret_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--secret-file",
        metavar="FILE",
        help="the application's secret (spark.arrowbeat.authenticate.secret) in an owner-only file, "
        "'-' for stdin; default: $ARROWBEAT_SECRET",
    )
    parser.add_argument(
        "--ca-file",
        metavar="PEM",
        help="the RM uses TLS (spark.arrowbeat.ssl.enabled): the certificate to trust, as PEM or the "
        "one-line value of spark.arrowbeat.ssl.generatedCert",
    )
    parser.add_argument(
        "--server-name", default="arrowbeat", help="with --ca-file: the name the RM's certificate carries"
    )


def _add_tables_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tables", required=True, metavar="PATH", help="spark.arrowbeat.tables.path (a directory or URI)"
    )
    parser.add_argument(
        "--properties-file",
        metavar="FILE",
        help="Spark properties (spark-defaults.conf form) with the spark.hadoop.* storage credentials "
        "of an object-store PATH",
    )


# --- executors -------------------------------------------------------------------------------------


def _executors(args: argparse.Namespace) -> int:
    from heartbeat.agent.main import SecretError, read_secret
    from heartbeat.errors import HeartbeatRpcError

    if not _ADDRESS.match(args.rm):
        raise CliError(f"--rm {args.rm!r}: expected HOST:PORT (spark.arrowbeat.rm.address)", USAGE)
    try:
        secret = read_secret(args.secret_file)
    except SecretError as exc:
        raise CliError(str(exc), USAGE) from None
    credentials, options = _tls(args.ca_file, args.server_name)

    def fetch() -> list[ExecutorInfo]:
        from heartbeat.rm.admin import list_executors

        try:
            return list_executors(
                args.rm, secret, args.timeout, channel_credentials=credentials, channel_options=options
            )
        except HeartbeatAuthenticationError:
            raise CliError(
                f"the RM at {args.rm} refused the secret, or is not this application's RM: give the "
                "application's spark.arrowbeat.authenticate.secret in ARROWBEAT_SECRET or --secret-file"
            ) from None
        except ProtocolVersionError as exc:
            raise CliError(f"the RM at {args.rm} speaks another protocol version: {exc}") from None
        except HeartbeatRpcError as exc:
            hint = (
                "check that --ca-file holds the RM's certificate and --server-name a name it carries, "
                "and that the RM uses TLS"
                if credentials is not None
                else "an RM with spark.arrowbeat.ssl.enabled=true answers only over TLS: pass --ca-file"
            )
            raise RmUnreachableError(
                f"no answer from an RM at {args.rm} within {args.timeout:g} s ({exc}): is the application "
                f"running and {args.rm} its spark.arrowbeat.rm.address? {hint}"
            ) from None

    show = _print_json if args.json else _print_table
    if args.watch is None:
        show(fetch(), time.time(), sys.stdout)
        return 0
    clear = sys.stdout.isatty() and not args.json
    with _until_signalled() as stop:
        while not stop.is_set():
            try:
                executors = fetch()
            except RmUnreachableError as exc:
                print(f"{time.strftime('%H:%M:%S')} arrowbeat: {exc}", file=sys.stderr, flush=True)
            else:
                if clear:
                    sys.stdout.write("\x1b[H\x1b[2J")
                elif not args.json:
                    print(f"-- {time.strftime('%Y-%m-%d %H:%M:%S')} {args.rm}")
                show(executors, time.time(), sys.stdout)
                sys.stdout.flush()
            stop.wait(args.watch)
    return 0


def _tls(
    ca_file: str | None, server_name: str
) -> tuple[grpc.ChannelCredentials | None, list[tuple[str, str]]]:
    """gRPC credentials that trust only the certificate in ``ca_file`` (as the agents do)."""
    if not ca_file:
        return None, []
    import grpc

    from spark_plugin.settings import tls

    try:
        text = Path(ca_file).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(
            f"cannot read --ca-file {ca_file}: {getattr(exc, 'strerror', None) or exc}", USAGE
        ) from None
    from cryptography import x509

    try:
        pem = text.encode("ascii") if "-----BEGIN" in text else tls.decode_line(text, "CERTIFICATE")
        x509.load_pem_x509_certificates(pem)  # raises ValueError unless it holds certificates
    except ValueError:
        raise CliError(
            f"--ca-file {ca_file} holds no PEM certificate nor a spark.arrowbeat.ssl.generatedCert value",
            USAGE,
        ) from None
    credentials = grpc.ssl_channel_credentials(root_certificates=pem)
    return credentials, [(tls.GRPC_TARGET_NAME_OVERRIDE, server_name)]


def _print_json(executors: Sequence[ExecutorInfo], now: float, out: TextIO) -> None:
    print(json.dumps(executor_rows(executors, now)), file=out)


def _print_table(executors: Sequence[ExecutorInfo], now: float, out: TextIO) -> None:
    def num(value: object, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    head = ["EXECUTOR", "HOST", "STATE", "HB AGE", "RTT ms", "SLOTS", "TASKS", "RSS MiB", "PULSE ms"]
    head += ["POOL %", "PID", "UP", "INSTANCE"]
    lines = [head]
    for r in executor_rows(executors, now):
        slots = "-" if r["slots_total"] is None else f"{num(r['slots_busy'], 'd')}/{r['slots_total']}"
        lines.append(
            [
                r["executor_id"],
                r["host"],
                r["state"],
                "-" if r["heartbeat_age_s"] is None else f"{r['heartbeat_age_s']:.1f}s",
                num(r["rtt_ms"], ".1f"),
                slots,
                num(r["running_tasks"], "d"),
                "-" if r["rss_bytes"] is None else f"{r['rss_bytes'] / 2**20:.0f}",
                num(r["jvm_pulse_age_ms"], "d"),
                num(r["shuffle_pool_used_pct"], ".0f"),
                num(r["pid"], "d"),
                "-" if r["up_s"] is None else _duration(r["up_s"]),
                r["instance_id"][:8],
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    for line in lines:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip(), file=out)
    if len(lines) == 1:
        print("(no executor registered with this RM)", file=out)


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


# --- tables: where and which ------------------------------------------------------------------------


def _location(args: argparse.Namespace) -> TablesLocation:
    settings = _properties(Path(args.properties_file)) if args.properties_file else {}
    try:
        return locate(args.tables, settings)
    except PluginError as exc:
        raise CliError(str(exc), USAGE) from None


def _properties(path: Path) -> dict[str, str]:
    """A Spark properties file (``key value`` or ``key=value`` per line, ``#`` comments)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CliError(f"cannot read --properties-file {path}: {exc.strerror or exc}", USAGE) from None
    settings = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "!")):
            key, *value = re.split(r"\s*[=:\s]\s*", line, maxsplit=1)
            settings[key] = value[0].strip() if value else ""
    return settings


@contextlib.contextmanager
def _until_signalled() -> Iterator[threading.Event]:
    """An event set by SIGINT or SIGTERM while the block runs (the previous handlers come back)."""
    stop = threading.Event()

    def handler(signum: int, frame: object) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


# --- events ------------------------------------------------------------------------------------------


def _events(args: argparse.Namespace) -> int:

    location = _location(args)
    table = open_history_table(location, EXECUTOR_EVENTS.name)
    app = args.app
    if app is not None:
        try:
            app = resolve_app(location, app)
        except UnknownApplicationError:
            if not args.follow or app == "latest":
                raise
            print(f"arrowbeat: no event of {app} yet; waiting for it", file=sys.stderr, flush=True)
    # Each new version re-reads the (small) event rows of the app and prints the unseen ones:
    # compaction rewrites old rows into new files, so new files are not new rows.
    seen: set[tuple[Any, ...]] = set()

    def emit_new() -> None:
        for row in read_rows(table, location, app).to_pylist():
            key = (
                row["app_id"],
                row["executor_id"],
                row["instance_id"],
                row["ts"],
                row["event"],
                row["detail"],
            )
            if key not in seen:
                seen.add(key)
                print(format_event(row), flush=args.follow)

    if not args.follow:
        emit_new()
        return 0
    with _until_signalled() as stop:  # before the first line: a reader may signal once it sees one
        version = table.version()
        emit_new()
        while not stop.wait(args.interval):
            try:
                table.update_incremental()
            except Exception as exc:  # storage trouble: say so, keep following
                shown = location.spark_uri(EXECUTOR_EVENTS.name)
                why = one_line(location.scrub(exc), MAX_ERROR_CHARS, reflow=True)
                print(f"arrowbeat: cannot refresh {shown}: {why}", file=sys.stderr)
                continue
            if table.version() != version:
                version = table.version()
                emit_new()
    return 0


def still_degraded(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``DEGRADED`` rows (oldest first) of ``rows`` (``executor_events``, by ``ts``) that no
    later ``RECOVERED`` or departure of the same executor of the same application ended."""
    open_: dict[tuple[Any, Any], dict[str, Any]] = {}
    for row in rows:
        key = (row["app_id"], row["executor_id"])
        if row["event"] == "DEGRADED":
            open_.setdefault(key, row)
        elif row["event"] in DEGRADED_ENDS:
            open_.pop(key, None)
    return sorted(open_.values(), key=lambda r: r["ts"])


def _degraded(args: argparse.Namespace) -> int:
    """``arrowbeat degraded``: one line per executor degraded now (its DEGRADED event, with the
    evidence), or a line saying none is."""
    location = _location(args)
    table = open_history_table(location, EXECUTOR_EVENTS.name)
    app = resolve_app(location, args.app)
    found = still_degraded(read_rows(table, location, app).to_pylist())
    for row in found:
        print(format_event(row))
    if not found:
        print(f"no executor of {app} is degraded (slower than its peers)")
    return 0


# --- tables ------------------------------------------------------------------------------------------


def _tables(args: argparse.Namespace) -> int:

    location = _location(args)
    present = [name for name in HISTORY_TABLES if has_table(location, name)]
    if not present:
        open_history_table(location, EXECUTOR_EVENTS.name)  # raises, naming where it looked
    action: Callable[[TablesLocation, str, argparse.Namespace], None] = {
        "describe": _describe,
        "compact": _compact,
        "vacuum": _vacuum,
    }[args.action]
    failed = 0
    for name in HISTORY_TABLES:
        if name not in present:
            print(f"{name}: no table at {location.spark_uri(name)}", flush=True)
            continue
        try:
            action(location, name, args)
        except Exception as exc:  # one table's trouble (a concurrent commit, storage): say it, go on
            failed += 1
            why = one_line(location.scrub(exc), MAX_ERROR_CHARS, reflow=True)
            print(f"{name}: {args.action} failed: {why}", flush=True)
    return FAILED if failed else 0


def _files(table: Any) -> tuple[int, int, int]:
    """(files, bytes, rows) of the table's current version, from its log (no data read)."""
    import pyarrow as pa

    adds = pa.table(table.get_add_actions(flatten=True))
    sizes = adds.column("size_bytes").to_pylist() if adds.num_rows else []
    rows = (
        adds.column("num_records").to_pylist() if adds.num_rows and "num_records" in adds.column_names else []
    )
    return adds.num_rows, sum(s or 0 for s in sizes), sum(r or 0 for r in rows)


def _describe(location: TablesLocation, name: str, args: argparse.Namespace) -> None:
    import pyarrow as pa

    table = open_history_table(location, name)
    files, size, rows = _files(table)
    adds = pa.table(table.get_add_actions(flatten=True))
    span = "-"
    if adds.num_rows and "min.ts" in adds.column_names:
        lows = [t for t in adds.column("min.ts").to_pylist() if t is not None]
        highs = [t for t in adds.column("max.ts").to_pylist() if t is not None]
        if lows and highs:
            span = f"{min(lows):%Y-%m-%d %H:%M:%S} .. {max(highs):%Y-%m-%d %H:%M:%S} UTC"
    apps = pa.table(table.to_pyarrow_table(columns=["app_id"])).column("app_id").unique()
    last = table.history(limit=1)[0]
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(last["timestamp"] / 1000))
    config = table.metadata().configuration
    print(f"{name}: {location.spark_uri(name)}")
    shape = f"{files} files, {size_text(size)}, {rows} rows"
    print(f"  version {table.version()}, {shape}, {len(apps)} applications")
    print(f"  rows from {span}")
    print(f"  last commit {when} UTC: {last.get('operation', '?')}")
    removed, log = (config.get(f"delta.{k}RetentionDuration", "-") for k in ("deletedFile", "log"))
    print(f"  retention of removed files: {removed}; of the log: {log}")
    print(flush=True)


def _compact(location: TablesLocation, name: str, args: argparse.Namespace) -> None:

    table = open_history_table(location, name)
    files, size, _ = _files(table)
    print(f"{name}: compacting {files} files ({size_text(size)}) ...", flush=True)
    started = time.monotonic()
    metrics = table.optimize.compact()
    table = open_history_table(location, name)
    table.create_checkpoint()
    after, after_size, _ = _files(table)
    print(
        f"{name}: {files} -> {after} files ({size_text(after_size)}; "
        f"{metrics.get('numFilesRemoved', 0)} merged) "
        f"and a checkpoint at version {table.version()} in {time.monotonic() - started:.1f} s",
        flush=True,
    )


def _vacuum(location: TablesLocation, name: str, args: argparse.Namespace) -> None:

    table = open_history_table(location, name)
    retention = table.metadata().configuration.get(
        "delta.deletedFileRetentionDuration", "Delta's default (7 days)"
    )
    verb = "would remove" if args.dry_run else "removed"
    print(f"{name}: vacuuming files removed longer ago than {retention} ...", flush=True)
    started = time.monotonic()
    # full: also the files whose tombstones a checkpoint already dropped (else they stay forever)
    removed = table.vacuum(dry_run=args.dry_run, full=True)
    if not args.dry_run:
        table.cleanup_metadata()
    print(f"{name}: {verb} {len(removed)} files in {time.monotonic() - started:.1f} s", flush=True)


# --- report ------------------------------------------------------------------------------------------


def _report(args: argparse.Namespace) -> int:
    no_plots = extras.missing("report")
    if no_plots:
        raise CliError(no_plots)
    location = _location(args)
    timeout_s = args.timeout if args.timeout is not None else DEFAULT_TIMEOUT_S
    app_id, history = write_report(location, args.app, args.output, timeout_s, max(1, args.max_plots))
    losses = sum(1 for e in history.events if e["event"] in ("HEARTBEAT_TIMEOUT", "UNREACHABLE"))
    print(
        f"wrote {args.output.resolve()}: {app_id}, {len(history.executors)} executors, "
        f"{losses} missed-heartbeat or unreachable events, {len(history.shuffles)} shuffles"
    )
    return 0


def run() -> None:
    """The console script: :func:`main`, then an exit without interpreter finalisation
    (``history.reader.run_reader``): reading a Delta table with delta-rs can abort a normal exit
    after the work is done (exit 134), and a command's exit status must be its own."""
    from spark_plugin.history.reader import run_reader

    run_reader(main)


if __name__ == "__main__":
    run()
