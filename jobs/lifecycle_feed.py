"""A live feed of executor lifecycle events (``executor_events`` Delta table), one line per event.

    spark-submit $(python -m spark_plugin conf) jobs/lifecycle_feed.py \
        --tables <spark.arrowbeat.tables.path> --checkpoint /tmp/feed-ckpt
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from spark_plugin.history.event_lines import format_event
from spark_plugin.jobs.common import add_table_args, trigger_of


def start(
    spark: Any,
    tables: str,
    checkpoint: str,
    trigger: dict[str, Any],
    emit: Callable[[str], None] = print,
) -> Any:
    """Starts the feed; every new event reaches ``emit`` as one line, in event-time order per batch."""

    def show(batch: Any, _batch_id: int) -> None:
        for row in batch.orderBy("ts").collect():
            emit(format_event(row))

    events = spark.readStream.format("delta").load(f"{tables.rstrip('/')}/executor_events")
    return (
        events.writeStream.foreachBatch(show)
        .option("checkpointLocation", checkpoint)
        .trigger(**trigger)
        .queryName("arrowbeat_lifecycle_feed")
        .start()
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_table_args(parser)
    args = parser.parse_args(argv)
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName("arrowbeat-lifecycle-feed").getOrCreate()
    start(spark, args.tables, args.checkpoint, trigger_of(args), emit=lambda line: print(line, flush=True))
    spark.streams.awaitAnyTermination()
    return 0


if __name__ == "__main__":
    sys.exit(main())
