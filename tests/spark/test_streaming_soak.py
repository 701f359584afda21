"""The streaming soak's short form: a Structured Streaming query with an arrowbeat grouped shuffle
in every micro-batch, materialized and pipelined by turns, every answer compared with Spark's
(``spark_plugin.jobs.streaming_soak``; ``benchmarks/streaming_soak.py`` is the long form, which
also measures memory per 1,000 shuffles).

On the shuffle cluster (two executors, reads of the other executor's outputs streamed through its
agent): a bounded number of micro-batches, each exact, none failed, and no process of the
application (Python driver, driver JVM, arrowbeat's driver-side process, executor JVMs, agents,
Python workers) holding more descriptors at the end than after the warm-up.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_plugin.jobs import streaming_soak
from tests.harness.apps import ShuffleCluster

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SHUFFLES = 80
"""40 per mode: about a minute on this 2-core machine once the cluster is warm."""
WARM_UP = 0.25
"""The first 20 shuffles start the Python workers, open the agents' and the rendezvous'
connections and fill Spark's caches; descriptors are compared after them."""
FDS_SLACK = 3
"""Most descriptors a process may gain over the last 60 shuffles. Samples are taken between
batches, when no task of ours runs, and compared as medians of five: in runs here every process
stayed within -2..0 (the driver JVM's idle pooled connections closing). A leak of one descriptor
every 15 shuffles, of either mode, exceeds it."""


def test_every_micro_batch_is_exact_and_no_process_gains_descriptors(
    shuffle_cluster: ShuffleCluster, tmp_path: Path
) -> None:
    config = streaming_soak.SoakConfig(max_shuffles=SHUFFLES, sample_every_s=0.0, hang_s=120.0)
    result = streaming_soak.run(shuffle_cluster.spark, config, str(tmp_path / "checkpoint"))

    assert result.query_error is None
    assert result.wrong_batches == 0 and result.failed_batches == 0, result.errors
    assert result.shuffles == SHUFFLES
    assert result.by_mode == {"materialized": SHUFFLES // 2, "pipelined": SHUFFLES // 2}
    measured = [g for g in streaming_soak.growth(result, warm_up=WARM_UP) if g.fds_growth is not None]
    kinds = [g.kind for g in measured]
    # The sampler found every kind of process it is meant to watch, through the whole window.
    for kind in ("python driver", "driver JVM", "driver-side arrowbeat", "executor JVM", "agent"):
        assert kind in kinds, (kind, sorted(kinds))
    assert kinds.count("agent") == 2 and kinds.count("executor JVM") == 2
    assert "Python worker" in kinds
    grown = [
        (g.label, g.fds_start, g.fds_end, g.fds_growth) for g in measured if (g.fds_growth or 0) > FDS_SLACK
    ]
    assert not grown, grown
