"""Follow a DataFrame through ``group_apply``: how often planning one grouped shuffle enters
arrowbeat's files and changes folder (issue 38's measure of how well code is grouped by where it
runs and what it does).

Starts a local Spark session (``local[1]``, arrowbeat's settings, no plugin), then records every
call of a named arrowbeat function (``sys.setprofile``; comprehensions and lambdas not counted)
that is handed the DataFrame, a DataFrame made from it, or its session (``--all-calls``: every
call) while ``group_apply(df, "k", fn, schema)`` builds its plan (the call is lazy: nothing runs),
and prints: calls, distinct files, re-entries (calls into a file already entered and left), folder
changes (consecutive calls in different folders), and, with ``--trace``, every call.

    .venv/bin/python -m scripts.follow_dataframe [--trace] [--root OTHER_CHECKOUT]
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_NAMES = ("spark_plugin", "arrow_shuffle", "heartbeat", "arrowbeat_base")


def _figures(calls: list[tuple[str, str]]) -> dict[str, int]:
    files = [f for f, _ in calls]
    seen: set[str] = set()
    reentries = 0
    folder_changes = 0
    previous: str | None = None
    for f in files:
        if previous is not None and f != previous and f in seen:
            reentries += 1
        if previous is not None and os.path.dirname(f) != os.path.dirname(previous):
            folder_changes += 1
        seen.add(f)
        previous = f
    return {"calls": len(files), "files": len(seen), "reentries": reentries, "folder_changes": folder_changes}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", action="store_true", help="print every call")
    parser.add_argument(
        "--all-calls", action="store_true", help="every arrowbeat call, not only those handed the DataFrame"
    )
    parser.add_argument("--root", default=str(ROOT), help="the checkout to follow (default: this one)")
    args = parser.parse_args(argv)
    root = Path(args.root).resolve()
    packages = tuple(str(root / p) + os.sep for p in PACKAGE_NAMES)
    sys.path.insert(0, str(root))
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    scratch = tempfile.mkdtemp(prefix="arrowbeat-follow-")
    spark = (
        SparkSession.builder.master("local[1]")
        .config("spark.driver.memory", "512m")
        .config("spark.local.dir", scratch)
        .config("spark.ui.enabled", "false")
        .config("spark.arrowbeat.tables.path", os.path.join(scratch, "tables"))
        .config("spark.arrowbeat.authenticate.secret", secrets.token_hex(16))
        .getOrCreate()
    )
    try:
        from spark_plugin.shuffle import group_apply

        df = spark.range(1000).selectExpr("id % 10 as k", "id as v")

        def fn(table: Any) -> Any:
            return table

        group_apply(df, "k", fn, "k long, v long")  # warm-up: imports, parsed schemas
        calls: list[tuple[str, str]] = []

        from pyspark.sql import DataFrame

        def carries_it(frame: FrameType) -> bool:
            """Whether the call was handed the DataFrame, one made from it, their session, or
            anything holding the session (a view of it)."""
            code = frame.f_code
            count = code.co_argcount + code.co_kwonlyargcount
            for name in code.co_varnames[:count]:
                value = frame.f_locals.get(name)
                if isinstance(value, DataFrame) or value is spark or getattr(value, "spark", None) is spark:
                    return True  # the DataFrame, the session, or a view of the session
            return False

        def profile(frame: FrameType, event: str, _arg: object) -> None:
            if event == "call":
                name = frame.f_code.co_filename
                named = name.startswith(packages) and not frame.f_code.co_name.startswith("<")
                if named and (args.all_calls or carries_it(frame)):
                    calls.append((os.path.relpath(name, root), frame.f_code.co_name))

        sys.setprofile(profile)
        try:
            group_apply(df, "k", fn, "k long, v long")
        finally:
            sys.setprofile(None)
    finally:
        spark.stop()
    if args.trace:
        for file, function in calls:
            print(f"{file}:{function}")
    for name, value in _figures(calls).items():
        print(f"RESULT {name}={value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
