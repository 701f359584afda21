"""A process as the executor agent's JVM checks read it through psutil (``create_time`` and
``status``), set by the test: stopped, sleeping, replaced by another with the same pid, or gone."""

from __future__ import annotations

from dataclasses import dataclass

import psutil


@dataclass
class FakeProcess:
    pid: int
    state: str
    created: float = 100.0
    gone: bool = False

    def create_time(self) -> float:
        if self.gone:
            raise psutil.NoSuchProcess(self.pid)
        return self.created

    def status(self) -> str:
        return self.state
