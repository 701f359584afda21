"""``python -m spark_plugin conf`` prints spark-submit flags; ``config-docs`` prints the key table."""

from __future__ import annotations

import argparse
import shlex
import sys

from spark_plugin.config import docs_table
from spark_plugin.launch import SetupError, submit_flags


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spark_plugin")
    sub = parser.add_subparsers(dest="command", required=True)
    conf = sub.add_parser("conf", help="print the spark-submit flags that turn arrowbeat on")
    conf.add_argument("--python", help="interpreter for arrowbeat's processes (default: this one)")
    conf.add_argument("--no-delta", action="store_true", help="leave Delta's session extension off")
    sub.add_parser("config-docs", help="print the table of spark.arrowbeat.* keys (Markdown)")
    args = parser.parse_args(argv)
    if args.command == "config-docs":
        print(docs_table())
        return 0
    try:
        print(shlex.join(submit_flags(args.python, delta=not args.no_delta)))
    except SetupError as exc:
        print(f"arrowbeat: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
