"""What a reduce task does when a map output it needs is gone or damaged, and its other talks with
agents: ask the owner's agent to arrange the recompute, wait until Spark can see it, and say
which executor and map partitions in the task's error.

A map output that vanished (``lost_outputs``) has its executor replaced through that executor's
JVM; a damaged one (``damaged_output``) is removed with its Spark status blocks by its owner's
agent, so the retry meets a fetch failure and Spark reruns those map partitions. Spark Connect: a
plan made from a Connect session carries no secret (the client never sees it), so a reduce task
that streams gets it from its own agent (``keyed``), and ``release_function`` releases a shuffle
from a task.
"""

from __future__ import annotations

import json
import socket
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import pyarrow as pa

from arrow_shuffle.errors import CorruptDataError, MapOutputLostError, ShuffleError
from arrowbeat_base.clock import SYSTEM_CLOCK, Clock
from spark_plugin.shuffle.agent_layout import shuffle_roots
from spark_plugin.shuffle.plan import ShufflePlan, client_transport
from spark_plugin.shuffle.worker.agent_client import AgentInfo, MapOutputClient, find_agent, secret_of


def agent_client(plan: ShufflePlan, address: tuple[str, int]) -> MapOutputClient:
    """A control connection to the agent at ``address`` with ``plan``'s secret and transport."""
    return MapOutputClient(
        address, plan.secret, f"agent {address[0]}:{address[1]}", transport=client_transport(plan)
    )


def keyed(plan: ShufflePlan, me: AgentInfo) -> ShufflePlan:
    """``plan`` with the application secret: its own, or, for a plan made without one (from a
    Spark Connect session, which never sees it), the one this worker's agent hands it."""
    if plan.secret:
        return plan
    return replace(plan, secret=secret_of(me))


def release_function(
    plan: ShufflePlan, agents: Sequence[tuple[str, int]], clock: Clock = SYSTEM_CLOCK
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A task that releases the shuffle in every agent of ``agents`` and yields the bytes freed.

    How a driver that cannot reach the agents itself (a Spark Connect client: outside the
    cluster, without the secret) releases a shuffle: one task, inside the cluster, keyed by its
    own executor's agent. An agent that is gone took its data with it."""

    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for _ in batches:  # the one range row that made this task
            pass
        keyed_plan = keyed(plan, find_agent(shuffle_roots(plan.root), plan.app_id, clock=clock))
        freed = 0
        for host, port in agents:
            try:
                with agent_client(keyed_plan, (host, port)) as client:
                    freed += client.release(keyed_plan.shuffle_id)
            except ShuffleError:
                continue
        yield pa.record_batch([pa.array([freed], pa.int64())], names=["freed"])

    return run


def _files_of(items: Sequence[dict[str, Any]]) -> list[tuple[str, list[tuple[Any, ...]]]]:
    """One executor's map-output files and, per file, the segments of every partition to read,
    in reduce-partition order (``items`` are in that order)."""
    files: dict[str, list[tuple[Any, ...]]] = {}
    for s in items:
        files.setdefault(s["path"], []).extend(tuple(x) for x in json.loads(s["segments"]))
    return list(files.items())


def _label(plan: ShufflePlan, reducers: Sequence[int]) -> str:
    which = (
        f"reduce partition {reducers[0]}"
        if len(reducers) == 1
        else (f"reduce partitions {reducers[0]}-{reducers[-1]}")
    )
    return f"shuffle {plan.shuffle_id}, {which}"


def lost_outputs(
    plan: ShufflePlan, statuses: Sequence[dict[str, Any]], message: str, clock: Clock = SYSTEM_CLOCK
) -> MapOutputLostError:
    """The error to fail a reduce task with when map outputs could not be read, once Spark can act.

    Spark lists the outputs as fine: only when their executor is gone does it drop them, so that
    the task's retry meets a fetch failure and Spark recomputes exactly those map partitions. So,
    first, each owner's agent is told which of its files could not be read (``report_lost``): one
    that finds them gone has its JVM ask Spark to replace the executor; an agent that died made
    its JVM ask already. Rows of those owners that another executor carries (``stale_carriers``)
    would outlive that replacement: the carrier's agent is told (``carried_lost``) and has its
    executor replaced too. Then the task waits, at most ``plan.lost_wait_s`` (Spark's own
    ``spark.shuffle.io.retryWait`` before a fetch failure), for those agents to stop answering:
    their executors are going, and the retry then sees a fetch failure, not the same stale
    outputs."""
    owners: dict[tuple[str, int], list[str]] = defaultdict(list)
    for s in statuses:
        owners[(str(s["host"]), int(s["control_port"]))].append(str(s["path"]))
    answering = []
    lost = set()
    for (host, port), paths in owners.items():
        try:
            with agent_client(plan, (host, port)) as client:
                chunks = [paths[i : i + 1000] for i in range(0, len(paths), 1000)]
                if any([client.report_lost(plan.shuffle_id, chunk) for chunk in chunks]):
                    answering.append((host, port))
                    lost.add((host, port))
        except ShuffleError:
            lost.add((host, port))
            continue  # the agent is gone: its JVM reported the loss when it died
    for (host, port), gone in stale_carriers(statuses, lost).items():
        try:
            with agent_client(plan, (host, port)) as client:
                if client.carried_lost(plan.shuffle_id, gone):
                    answering.append((host, port))
        except ShuffleError:
            continue  # the carrier is gone: Spark dropped what it carried
    _wait_gone(answering, plan.lost_wait_s, clock)
    return MapOutputLostError(message)


def _wait_gone(answering: list[tuple[str, int]], wait_s: float, clock: Clock) -> None:
    """Waits, at most ``wait_s``, for the agents ``answering`` to stop: their executors are being
    replaced, and the task's retry must meet a fetch failure, not the same stale outputs."""
    deadline = clock.monotonic() + wait_s
    pause = threading.Event()
    while answering and clock.monotonic() < deadline:
        answering = [a for a in answering if _answers(a)]
        pause.wait(0.1)
    if not answering:  # give the driver the moment it needs to drop the executor's outputs
        pause.wait(min(1.0, wait_s))


def damaged_output(
    plan: ShufflePlan, status: dict[str, Any], label: str, exc: CorruptDataError, clock: Clock = SYSTEM_CLOCK
) -> MapOutputLostError:
    """The error to fail a reduce task with when a map output it read host-locally is damaged.

    Reading it again would fail the same way: its owner's agent is told (``report_corrupt``), and
    removes it and has Spark recompute it (``corrupt_outputs``): by dropping its status rows, so
    the task's retry meets a fetch failure for exactly that map partition (answered at once), or,
    where it cannot, by replacing the executor (then the task waits for it to go, as for a lost
    output). An owner that cannot be told is going or gone, which Spark sees by itself."""
    owner = (str(status["host"]), int(status["control_port"]))
    where = (
        f"{label}: the map output of map partition {status['map']} on executor {status['executor']} "
        f"({status['path']}) is damaged ({exc})"
    )
    try:
        with agent_client(plan, owner) as client:
            outcome = client.report_corrupt(plan.shuffle_id, str(status["path"]), str(exc))
    except ShuffleError as err:
        return MapOutputLostError(
            f"{where}; its executor's agent cannot be told ({err}): Spark retries the task"
        )
    if outcome == 1:
        return MapOutputLostError(
            f"{where}; Spark recomputes map partition {status['map']} and retries the task"
        )
    if outcome == 2:
        _wait_gone([owner], plan.lost_wait_s, clock)
        return MapOutputLostError(
            f"{where}; Spark replaces executor {status['executor']} and recomputes its outputs"
        )
    return MapOutputLostError(
        f"{where}; shuffle {plan.shuffle_id} was released on executor {status['executor']}, so map "
        f"partition {status['map']} cannot be recomputed any more: run the query again"
    )


def stale_carriers(
    statuses: Sequence[dict[str, Any]], lost: set[tuple[str, int]]
) -> dict[tuple[str, int], list[str]]:
    """The agents (host, control port) of executors that carry status rows naming outputs of the
    owners in ``lost`` (their agent found them missing, or is unreachable), with those owners'
    executor ids. A row is trusted only where its outputs are: one carried elsewhere
    (``carry_function``) outlives its owner's replacement, so the carrier must go too."""
    carriers: dict[tuple[str, int], set[str]] = defaultdict(set)
    for s in statuses:
        carrier = s.get("carrier")
        if not carrier or carrier == s["executor"]:
            continue
        if (str(s["host"]), int(s["control_port"])) in lost:
            carriers[(str(s["carrier_host"]), int(s["carrier_port"]))].add(str(s["executor"]))
    return {address: sorted(owners) for address, owners in carriers.items()}


def _answers(address: tuple[str, int]) -> bool:
    """Does something still accept connections at ``address``?"""
    try:
        with socket.create_connection(address, timeout=1.0):
            return True
    except OSError:
        return False
