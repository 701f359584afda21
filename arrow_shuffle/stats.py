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

    def as_dict(self, prefix: str = "partition.") -> dict[str, float]:
        return {prefix + k: float(v) for k, v in dataclasses.asdict(self).items()}


@dataclass
class ChannelStats:
    """Consumer side, one remote channel: what it received, and its witness of the credit rules."""

    buffers_received: int = 0
    bytes_received: int = 0
    buffers_consumed: int = 0
    credits_announced: int = 0
    credit_announcements: int = 0
    """ADD_CREDIT messages sent (credits are batched: fewer than the buffers received)."""
    buffers_without_credit: int = 0
    """Buffers that arrived with no announced-and-unused credit or no free buffer (must be 0)."""
    max_in_flight: int = 0
    """Most buffers received and not yet consumed, sampled on every receive."""
    max_in_flight_over_credit: int = 0
    """Largest excess of in-flight buffers over credit announced for unconsumed ones (must be 0)."""

    def as_dict(self, prefix: str = "channel.") -> dict[str, float]:
        return {prefix + k: float(v) for k, v in dataclasses.asdict(self).items()}


@dataclass
class GateStats:
    """Consumer side, one input gate (the credit fields summarise its remote channels)."""

    batches_received: int = 0
    rows_received: int = 0
    buffers_received: int = 0
    bytes_received: int = 0
    credits_announced: int = 0
    blocked_on_data_s: float = 0.0
    channels_finished: int = 0
    buffers_without_credit: int = 0
    """Summed over the remote channels; anything but 0 means a sender broke the credit contract."""
    max_in_flight: int = 0
    """The largest ``ChannelStats.max_in_flight`` of the remote channels."""
    max_in_flight_over_credit: int = 0
    """The largest ``ChannelStats.max_in_flight_over_credit`` of the remote channels."""

    def as_dict(self, prefix: str = "gate.") -> dict[str, float]:
        return {prefix + k: float(v) for k, v in dataclasses.asdict(self).items()}


@dataclass
class StatsCell:
    """A stats record guarded by a lock, updated from several threads."""

    value: Any
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, **deltas: float) -> None:
        fields = self.value.__dict__  # called per buffer: plain dict updates, no attribute lookups
        with self._lock:
            for name, delta in deltas.items():
                fields[name] += delta

    def snapshot(self) -> Any:
        with self._lock:
            return dataclasses.replace(self.value)
