"""What the streaming jobs share: their command-line arguments (tables, checkpoint, trigger)."""

from __future__ import annotations

import argparse
from typing import Any


def add_table_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tables", required=True, help="spark.arrowbeat.tables.path of the application")
    parser.add_argument("--checkpoint", required=True, help="checkpoint folder of this query")
    parser.add_argument(
        "--available-now",
        action="store_true",
        help="process what is there and stop (default: run until stopped, every --trigger)",
    )
    parser.add_argument("--trigger", default="10 seconds", help="processing-time trigger interval")


def trigger_of(args: argparse.Namespace) -> dict[str, Any]:
    """Keyword arguments for ``DataStreamWriter.trigger``."""
    return {"availableNow": True} if args.available_now else {"processingTime": args.trigger}
