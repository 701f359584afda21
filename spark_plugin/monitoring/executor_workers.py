"""The Python workers under an executor JVM and the task each runs: every process below the JVM but
the agent's, with the task of the worker ``worker_label`` labelled it is or descends from (a UDF's
subprocess counts for its task), and its CPU seconds. Looked up through ``psutil``; the task watch
takes the scan as a function, so its decisions are tested without processes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import psutil

from spark_plugin.python_worker.worker_label import LABEL_PREFIX


@dataclass(frozen=True, slots=True)
class ProcessCpu:
    """One process under the executor JVM (the agent's tree left out) and its CPU seconds."""

    pid: int
    task: int | None
    """The task of the labelled worker it is, or descends from (a UDF's subprocess); None if none."""
    cpu_s: float
    labelled: bool = False
    """It is the labelled worker itself (the one a stack is asked of)."""


WorkerScan = Callable[[], list[ProcessCpu]]


def labelled_workers(jvm_pid: int, agent_pid: int) -> WorkerScan:
    """Every process under ``jvm_pid`` but the agent and its children, each with the task of the
    worker labelled by ``worker_label`` it is or descends from, and its CPU time."""

    def scan() -> list[ProcessCpu]:
        try:
            children = psutil.Process(jvm_pid).children(recursive=True)
        except psutil.Error:
            return []
        parents: dict[int, int] = {}
        labels: dict[int, int] = {}
        cpu: dict[int, float] = {}
        for proc in children:
            try:
                parents[proc.pid] = proc.ppid()
                name = proc.name()
                if name.startswith(LABEL_PREFIX) and name[len(LABEL_PREFIX) :].isdigit():
                    labels[proc.pid] = int(name[len(LABEL_PREFIX) :])
                times = proc.cpu_times()
                cpu[proc.pid] = times.user + times.system
            except psutil.Error:
                continue
        found = []
        for pid, seconds in cpu.items():
            task, walker = None, pid
            while walker in parents and walker != agent_pid:
                if task is None and walker in labels:
                    task = labels[walker]
                walker = parents[walker]
            if walker == agent_pid:
                continue  # the agent, or one of its children
            found.append(ProcessCpu(pid, task, seconds, pid in labels))
        return found

    return scan
