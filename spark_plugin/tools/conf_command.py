"""``python -m spark_plugin`` (and ``arrowbeat conf``): ``conf`` prints spark-submit flags; ``pack``
packs this venv for executors without arrowbeat (and prints the flags that ship it);
``config-docs`` prints the key table."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from spark_plugin.compat import versions
from spark_plugin.errors import SetupError
from spark_plugin.jvm.launch import notices, submit_flags
from spark_plugin.settings.config import docs_table

TABLE_BEGIN, TABLE_END = "<!-- config-table -->", "<!-- /config-table -->"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spark_plugin")
    sub = parser.add_subparsers(dest="command", required=True)
    conf = sub.add_parser("conf", help="print the spark-submit flags that turn arrowbeat on")
    conf.add_argument("--python", help="interpreter for arrowbeat's processes (default: this one)")
    conf.add_argument("--no-delta", action="store_true", help="leave Delta's session extension off")
    conf.add_argument("--archive", help="executors run this packed environment (see `pack`)")
    pack = sub.add_parser("pack", help="pack this venv (arrowbeat installed from a wheel) for executors")
    pack.add_argument("-o", "--output", required=True, help="the archive to write: .tar.gz, .tgz or .tar")
    pack.add_argument("--no-delta", action="store_true", help="leave Delta out of the printed flags")
    docs = sub.add_parser("config-docs", help="print the table of spark.arrowbeat.* keys (Markdown)")
    docs.add_argument("--write", metavar="FILE", help="replace the table between the markers in this file")
    args = parser.parse_args(argv)
    if args.command == "config-docs":
        if args.write:
            path = Path(args.write)
            text = path.read_text()
            begin, end = text.index(TABLE_BEGIN) + len(TABLE_BEGIN), text.index(TABLE_END)
            path.write_text(text[:begin] + "\n" + docs_table() + "\n" + text[end:])
        else:
            print(docs_table())
        return 0
    spark_version = versions.running_spark_version()
    support = versions.spark_support(spark_version)
    if not support.runs:
        print(f"arrowbeat: {support.message}", file=sys.stderr)
        return 2
    for notice in notices(delta=not args.no_delta, spark_version=spark_version):
        print(f"arrowbeat: {notice}", file=sys.stderr)
    try:
        if args.command == "pack":
            return _pack(Path(args.output), delta=not args.no_delta)
        print(shlex.join(submit_flags(args.python, delta=not args.no_delta, archive=args.archive)))
    except SetupError as exc:
        print(f"arrowbeat: {exc}", file=sys.stderr)
        return 1
    return 0


def _pack(output: Path, delta: bool) -> int:
    """Packs, then prints the spark-submit flags (stdout) and what executors need (stderr)."""
    from spark_plugin.tools.pack import pack

    packed = pack(output)
    flags = submit_flags(delta=delta, archive=str(packed.archive))
    print(
        f"arrowbeat: wrote {packed.archive} ({packed.size_bytes / 2**20:.0f} MiB, {packed.files} entries); "
        f"executors need the Python it was made from at {packed.base_python}. Flags (also: "
        f"`python -m spark_plugin conf --archive {shlex.quote(str(packed.archive))}`):",
        file=sys.stderr,
    )
    print(shlex.join(flags))
    return 0
