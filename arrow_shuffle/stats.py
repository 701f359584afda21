"""Plain statistics records for partitions and gates.

``as_dict()`` yields ``str -> float`` so a heartbeat payload (``map<string,double>``) and the
shuffle-metrics table can carry them without knowing the engine.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass
class PartitionStats:
    """Producer side, one result partition."""

    batches_written: int = 0
    rows_written: int = 0
    buffers_written: int = 0
    bytes_written: int = 0
    buffers_sent: int = 0
    bytes_sent: int = 0
    blocked_on_pool_s: float = 0.0
    blocked_on_credit_s: float = 0.0
    spill_bytes: int = 0
    spill_buffers: int = 0

    def as_dict(self, prefix: str = "partition.") -> dict[str, float]:
        return {prefix + k: float(v) for k, v in dataclasses.asdict(self).items()}


@dataclass
class GateStats:
    """Consumer side, one input gate."""

    batches_received: int = 0
    rows_received: int = 0
    buffers_received: int = 0
    bytes_received: int = 0
    credits_announced: int = 0
    blocked_on_data_s: float = 0.0
    channels_finished: int = 0

    def as_dict(self, prefix: str = "gate.") -> dict[str, float]:
        return {prefix + k: float(v) for k, v in dataclasses.asdict(self).items()}


@dataclass
class StatsCell:
    """A stats record guarded by a lock, updated from several threads."""

    value: Any
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, **deltas: float) -> None:
        with self._lock:
            for name, delta in deltas.items():
                setattr(self.value, name, getattr(self.value, name) + delta)

    def snapshot(self) -> Any:
        with self._lock:
            return dataclasses.replace(self.value)
