"""A shuffle on the driver once planned: its handle (``ShuffleHandle``: plan, task reports, release),
its rows in the ``shuffle_metrics`` table, and the pipelined shuffles' rendezvous it started.

Life cycle: ``shuffle_of(out)`` is the shuffle's handle: ``release()`` (or ``with``) deletes its
map outputs in every agent that reported one and appends its rows to the ``shuffle_metrics``
Delta table (shuffles never released are written at interpreter exit); agents delete everything
when their executor ends, and release forgotten shuffles after ``spark.arrowbeat.shuffle.ttl``.
Spark Connect (no accumulators): the task reports are the eager map side's status rows, and
``release`` runs as one task inside the cluster.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from pyspark.accumulators import AccumulatorParam
from pyspark.sql import DataFrame, SparkSession

from arrow_shuffle.errors import ShuffleConfigError, ShuffleError
from spark_plugin.compat.accumulators import discard as discard_accumulator
from spark_plugin.shuffle.agent_layout import written_by
from spark_plugin.shuffle.driver import metrics_sink
from spark_plugin.shuffle.driver.route import (
    route_of,
)
from spark_plugin.shuffle.driver.session import (
    SessionView,
    as_view,
    conf_value,
)
from spark_plugin.shuffle.driver.shuffle_settings import shuffle_settings
from spark_plugin.shuffle.plan import ShufflePlan, server_transport, unreported
from spark_plugin.shuffle.worker.map_task import attempt_stage
from spark_plugin.shuffle.worker.output_recovery import agent_client, release_function

log = logging.getLogger("arrowbeat.shuffle")


class _ListParam(AccumulatorParam[list[dict[str, Any]]]):
    """Task reports (one dict per map or reduce task) gathered on the driver."""

    def zero(self, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return []

    def addInPlace(self, a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[dict[str, Any]]:
        a.extend(b)
        return a


class ShuffleHandle:
    """One shuffle: its plan, its task reports, and the way to release it."""

    def __init__(self, session: SessionView | SparkSession, plan: ShufflePlan, mode: str) -> None:
        view = as_view(session)  # its kind only: the conf is read live when the handle writes
        spark = self.spark = view.spark
        self.plan = plan
        self.mode = mode
        self.connect = view.connect
        """Made from a Spark Connect session: no accumulator, reports from the eager map side."""
        self._reports = None if self.connect else spark.sparkContext.accumulator([], _ListParam())
        self._collected: list[dict[str, Any]] = []
        self._let_go: Callable[[], Any] | None = None
        """Drops the accumulator's reports from PySpark's registry (``compat.accumulators``): at
        release, or when the handle is gone (then nothing could read them any more)."""
        if self._reports is not None:
            self._let_go = weakref.finalize(self, discard_accumulator, self._reports.aid)
        self._written_keys: set[tuple[str, int, str, bool]] = set()
        self._lock = threading.Lock()
        self.released = False
        self.persisted: DataFrame | None = None
        """The status rows of an adaptive shuffle, persisted when its map side ran (``_coalesced``)."""
        self.groups: list[range] | None = None
        """The reduce partitions each task of an adaptive shuffle reads: once the map side ran, or
        planned from the input's size (then ``persisted`` stays None)."""
        _LIVE.add(self)

    @property
    def shuffle_id(self) -> int:
        return self.plan.shuffle_id

    def reporter(self) -> Callable[[dict[str, Any]], None]:
        """What tasks call with their report: an accumulator's ``add``, or on Spark Connect (no
        accumulators) nothing: the map side's reports come back as its status rows instead."""
        acc = self._reports
        if acc is None:
            return unreported

        def report(row: dict[str, Any]) -> None:
            acc.add([row])

        return report

    def collected(self, reports: Iterable[dict[str, Any]]) -> None:
        """Reports the driver rebuilt itself (the map side's, from its status rows on Spark Connect)."""
        with self._lock:
            self._collected.extend(reports)

    def reports(self) -> list[dict[str, Any]]:
        """Every map and reduce task report received so far (successful task attempts only).

        On Spark Connect only the map side's, rebuilt from the status rows collected when the
        shuffle was made: reduce tasks, and map tasks Spark reruns later, report nowhere there."""
        received = [] if self._reports is None else list(self._reports.value)
        return received + list(self._collected)

    def agents(self) -> set[tuple[str, int]]:
        return {(str(r["control"][0]), int(r["control"][1])) for r in self.reports() if r["control"]}

    def flush_metrics(self) -> int:
        """Append the reports not yet written to the ``shuffle_metrics`` table; returns rows written.

        One row per (side, partition, attempt number, recomputed or not), however often the
        DataFrame is evaluated: a second evaluation (or an accumulator update Spark applies twice)
        repeats a key already written and is dropped; a recomputed partition is a row of its own,
        marked ``recomputed``."""
        with self._lock:
            everything = self.reports()
            recomputed = {str(a) for r in everything if r["side"] == "read" for _, a in r["recomputed_maps"]}
            damaged = self._damaged_outputs(everything, recomputed)
            fresh = []
            for report in everything:
                if report["side"] == "write" and report["attempt"] in recomputed:
                    report["recomputed"] = True  # readers name the map outputs of a recomputation
                found = damaged.get(int(report["partition"])) if report["side"] == "write" else None
                if found is not None and _stage(report["attempt"]) > found[0]:
                    report["recomputed"] = True  # written again: its first output was damaged
                    report["corrupt"] = found[1]
                key = _metric_key(report)
                if key in self._written_keys:
                    continue
                self._written_keys.add(key)
                fresh.append(report)
                if report["side"] == "write" and report["recomputed"]:
                    log.warning(
                        "shuffle %s: map partition %s was recomputed on executor %s",
                        self.shuffle_id,
                        report["partition"],
                        report["executor"],
                    )
            if not fresh:
                return 0
            try:
                to = metrics_sink.destination(self.spark, self.plan.app_id)
                metrics_sink.write_now(to, self.plan.app_id, self.shuffle_id, fresh)
            except BaseException:
                self._written_keys.difference_update(_metric_key(r) for r in fresh)
                raise
            return len(fresh)

    def _damaged_outputs(
        self, reports: list[dict[str, Any]], recomputed: set[str]
    ) -> dict[int, tuple[int, dict[str, str]]]:
        """Map partition -> the stage of its output that was found damaged, and where and how
        (the agents removed the damaged files and keep what they found, ``corrupt_outputs``).
        Asked only when some map partition was written in more than one stage, or a reader named a
        recomputation: when every map partition reran, no reader can tell. Empty on Spark Connect
        (no secret here) and for agents that are gone."""
        stages: dict[int, set[int]] = {}
        for r in reports:
            if r["side"] == "write" and _stage(r["attempt"]) >= 0:
                stages.setdefault(int(r["partition"]), set()).add(_stage(r["attempt"]))
        rewritten = any(len(s) > 1 for s in stages.values())
        if not (rewritten or recomputed) or self.connect:
            return {}
        executors = {
            (str(r["control"][0]), int(r["control"][1])): str(r["executor"]) for r in reports if r["control"]
        }
        found: dict[int, tuple[int, dict[str, str]]] = {}
        for address in sorted(self.agents()):
            try:
                with agent_client(self.plan, address) as client:
                    for partition, path, detail in client.corrupt_outputs(self.shuffle_id):
                        where = {"executor": executors.get(address, ""), "file": path, "found": detail}
                        found[int(partition)] = (_stage(written_by(path) or ""), where)
            except ShuffleError as exc:
                log.info("damaged outputs of shuffle %s not asked of %s: %s", self.shuffle_id, address, exc)
        return found

    def release(self) -> int:
        """Delete this shuffle's data in every agent that reported some; returns bytes freed.

        Only agents the map tasks named: the driver knows no path of an executor's disks. Files
        of an attempt that never reported go with the TTL sweep or their executor."""
        with self._lock:
            if self.released:
                return 0
            self.released = True
        if self.mode == "pipelined":  # its map tasks unregister as they end; whatever is left goes
            _forget_pipelined(self.plan.app_id, self.shuffle_id)
        freed = self._release_from_cluster() if self.connect else self._release_from_here()
        if self.persisted is not None:
            with contextlib.suppress(Exception):  # the session may be stopping
                self.persisted.unpersist()
        try:
            self.flush_metrics()
        except Exception as exc:  # metrics must never turn a release into a failure
            log.warning("shuffle_metrics rows of shuffle %s not written: %s", self.shuffle_id, exc)
        self._keep_reports()
        _LIVE.discard(self)
        return freed

    def _keep_reports(self) -> None:
        """Move the task reports out of PySpark's accumulator registry into this handle: a
        released shuffle takes no more, and PySpark would keep them for the process's life (20 MB
        per 1,000 shuffles of a streaming query); they go with the handle."""
        acc = self._reports
        if acc is None:
            return
        with self._lock:
            self._collected[:0] = list(acc.value)
            self._reports = None
        if self._let_go is not None:
            self._let_go()

    def _release_from_here(self) -> int:
        """The driver process calls each agent (it is in the cluster and holds the secret)."""
        freed = 0
        for address in sorted(self.agents()):
            try:
                with agent_client(self.plan, address) as client:
                    freed += client.release(self.shuffle_id)
            except ShuffleError as exc:  # an agent that is gone took its data with it
                log.info("release of shuffle %s: %s", self.shuffle_id, exc)
        return freed

    def _release_from_cluster(self) -> int:
        """A Spark Connect client may be outside the cluster and never sees the secret: one task
        calls the agents instead (``output_recovery.release_function``), keyed by its own agent."""
        agents = sorted(self.agents())
        if not agents:
            return 0
        try:
            table = (
                self.spark.range(0, 1, numPartitions=1)
                .mapInArrow(release_function(self.plan, agents), "freed bigint")
                .toArrow()
            )
        except Exception as exc:  # a stopped session: the agents' TTL and exit clean up
            log.info("release of shuffle %s: its release task did not run: %s", self.shuffle_id, exc)
            return 0
        return int(sum(v or 0 for v in table.column("freed").to_pylist()))

    def __enter__(self) -> ShuffleHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _stage(attempt: object) -> int:
    """The stage of a materialized map attempt (``stage.taskAttemptId.attemptNumber``); -1 for
    any other (a pipelined one names no stage)."""
    text = str(attempt)
    return attempt_stage(text) if re.fullmatch(r"\d+\.\d+\.\d+", text) else -1


def _metric_key(report: dict[str, Any]) -> tuple[str, int, str, bool]:
    """A report's identity in ``shuffle_metrics``: side, partition, Spark's attempt number (the
    last part of ``stage.taskAttemptId.attemptNumber``) and whether it was a recomputation."""
    return (
        str(report["side"]),
        int(report["partition"]),
        str(report["attempt"]).rsplit(".", 1)[-1],
        bool(report["recomputed"]),
    )


_LIVE: weakref.WeakSet[ShuffleHandle] = weakref.WeakSet()


@metrics_sink.at_exit
def _flush_at_exit() -> None:
    """Metrics of shuffles never released, written at interpreter exit (by the sink's one exit
    hook). Not those of Spark Connect sessions: locating the tables asks the server, and a
    client's gRPC retries against a server already gone would hold the exit for minutes."""
    for handle in list(_LIVE):
        if handle.connect:
            continue
        with contextlib.suppress(Exception):  # best effort: the session may be gone
            handle.flush_metrics()


def _attached(df: DataFrame, name: str) -> Any:
    """What this module attached to ``df`` under ``name``, or None. Read from the instance itself:
    a Spark Connect DataFrame answers unknown attributes by asking the server for its columns."""
    return getattr(df, "__dict__", {}).get(name)


def shuffle_of(df: DataFrame) -> ShuffleHandle:
    """The shuffle behind a DataFrame returned by this module."""
    handle = _attached(df, "_arrowbeat_shuffle")
    route = route_of(df)
    if not isinstance(handle, ShuffleHandle) and route is not None:
        raise ShuffleConfigError(
            f"this DataFrame ran on Spark's exchange, not arrowbeat's ({route.reason}): it has no "
            "arrowbeat shuffle; pass path='arrowbeat' to force one"
        )
    if not isinstance(handle, ShuffleHandle):
        raise ShuffleConfigError(
            "this DataFrame was not produced by arrow_shuffle.repartition/group_apply/partition_apply"
        )
    return handle


def release(df: DataFrame) -> int:
    """Release the shuffle behind ``df`` (see ``ShuffleHandle.release``); 0 for a call that was
    routed to Spark's exchange (``route``), which holds nothing of arrowbeat's."""
    if route_of(df) is not None and not isinstance(_attached(df, "_arrowbeat_shuffle"), ShuffleHandle):
        return 0
    return shuffle_of(df).release()


_rendezvous_lock = threading.Lock()


_rendezvous_of: dict[str, Any] = {}


def _rendezvous(session: SessionView | SparkSession, plan: ShufflePlan) -> Any:
    """The driver's rendezvous for pipelined map tasks, one per application, started on first use
    (and the previous application's closed).

    It holds running shuffles only: map tasks unregister as they end, ``ShuffleHandle.release``
    forgets the rest, and what nobody touched for ``spark.arrowbeat.shuffle.ttl`` is swept."""
    from spark_plugin.shuffle.driver.rendezvous import Rendezvous

    view = as_view(session)
    app = view.spark.sparkContext.applicationId
    with _rendezvous_lock:
        found = _rendezvous_of.get(app)
        if found is None:
            # A process runs one SparkContext at a time: an earlier application's is over.
            for ended in _rendezvous_of.values():
                ended.close()
            _rendezvous_of.clear()
            host = conf_value(view, "spark.driver.host", "127.0.0.1")
            ttl_s = shuffle_settings(view).shuffle_ttl_s
            found = _rendezvous_of[app] = Rendezvous(
                plan.secret, host, transport=server_transport(plan), ttl_s=ttl_s
            )
        return found


def _forget_pipelined(app: str, shuffle: int) -> None:
    """Drop a released pipelined shuffle's rendezvous entries (in this process: no call)."""
    with _rendezvous_lock:
        found = _rendezvous_of.get(app)
    if found is not None:
        found.forget(shuffle)
