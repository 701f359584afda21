"""``ShuffleConfig``: every engine setting declared once, with unit, default and range.

Validation happens in ``__post_init__`` so a bad value fails at start-up, not mid-shuffle,
with an error naming the field and its allowed range. Durations are measured on the ``Clock``
the engine's objects are given (``arrowbeat_base.clock``), except ``connect_timeout_s``, a socket's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from arrow_shuffle.errors import ShuffleConfigError

_MIB = 1 << 20


@dataclass(frozen=True)
class ShuffleConfig:
    """Engine settings. Sizes are bytes, durations seconds."""

    buffer_size: int = _MIB
    """Size of one network buffer (a pool segment); one frame payload at most."""
    network_memory_bytes: int = 256 * _MIB
    """Memory of the process-wide ``NetworkBufferPool`` (``// buffer_size`` segments)."""
    exclusive_buffers_per_channel: int = 2
    """Buffers each remote input channel owns; its initial credit."""
    floating_buffers_per_gate: int = 8
    """Buffers an input gate lends to whichever channel has the larger backlog."""
    buffers_per_subpartition: int = 2
    """Producer-side buffers per subpartition (plus ``floating_buffers_per_gate`` shared)."""
    flush_timeout_s: float = 0.1
    """A non-empty, not yet full buffer is flushed after at most this long; 0 flushes every write."""
    max_frame_bytes: int = 0
    """Largest data frame payload accepted from a peer; 0 means ``buffer_size``."""
    connect_timeout_s: float = 5.0
    """Overall bound on getting in: a client's connect + handshake (+ request), and the server's
    deadline for a new connection to authenticate (a slow-dripping peer cannot extend it)."""
    max_pending_connections: int = 64
    """Connections a server lets wait for authentication at once; more are refused (BUSY)."""
    max_streams: int = 512
    """Authenticated streams a ``PartitionServer`` serves at once; more are refused (BUSY)."""
    keepalive_interval_s: float = 1.0
    """An idle sender sends a keepalive frame this often."""
    peer_timeout_s: float = 4.0
    """Silence from the peer for this long means it is lost (``PeerLostError``); also bounds a
    stalled send."""
    buffer_request_timeout_s: float = 60.0
    """Longest a writer blocks waiting for a buffer before failing (backpressure bound)."""
    buffer_reserve_timeout_s: float = 300.0
    """Longest a partition created without its buffers (an agent's staged stream) queues for its
    reserved minimum, first come first served, before failing with an error naming them."""
    partition_pool_share: float = 1.0
    """Largest share of the network pool one partition may hold, reserved plus floating
    (never less than its reserved minimum), so one greedy stream cannot starve the others sharing
    the pool. 1.0 suits a pool of one partition (a pipelined map task's); an executor agent, whose
    pool all its staged streams share, caps it at ``agent_service.STREAM_POOL_SHARE``."""
    checksum: bool = True
    """Data frames carry a checksum of their payload (``frames.FLAG_CHECKSUM``, ``checksum.digest``),
    checked before the payload is decoded (``FrameChecksumError``). A sender with it on checksums
    what it sends; a reader with it on refuses a data frame without one, so both ends must agree
    (they take it from the same ``spark.arrowbeat.shuffle.checksum``). Off saves a hash pass over
    every byte per side (XXH3: about 0.04 s of CPU per GiB; the CRC-32 first used cost 0.3, and the
    channel benchmark, both ends on two cores, moved 1.0 GB/s with it against 4.5 without)."""

    def __post_init__(self) -> None:
        _check_range("buffer_size", self.buffer_size, 4096, 1 << 30)
        _check_range("network_memory_bytes", self.network_memory_bytes, self.buffer_size, 1 << 40)
        _check_range("exclusive_buffers_per_channel", self.exclusive_buffers_per_channel, 1, 1 << 16)
        _check_range("floating_buffers_per_gate", self.floating_buffers_per_gate, 0, 1 << 16)
        _check_range("buffers_per_subpartition", self.buffers_per_subpartition, 1, 1 << 16)
        _check_range("flush_timeout_s", self.flush_timeout_s, 0.0, 3600.0)
        if self.max_frame_bytes != 0:
            _check_range("max_frame_bytes", self.max_frame_bytes, self.buffer_size, 1 << 31)
        _check_range("connect_timeout_s", self.connect_timeout_s, 0.01, 600.0)
        _check_range("max_pending_connections", self.max_pending_connections, 1, 1 << 16)
        _check_range("max_streams", self.max_streams, 1, 1 << 16)
        _check_range("keepalive_interval_s", self.keepalive_interval_s, 0.01, 600.0)
        _check_range("peer_timeout_s", self.peer_timeout_s, self.keepalive_interval_s * 2, 3600.0)
        _check_range("buffer_request_timeout_s", self.buffer_request_timeout_s, 0.001, 86400.0)
        _check_range("buffer_reserve_timeout_s", self.buffer_reserve_timeout_s, 0.001, 86400.0)
        _check_range("partition_pool_share", self.partition_pool_share, 0.01, 1.0)
        if not isinstance(self.checksum, bool):
            raise ShuffleConfigError(f"checksum={self.checksum!r} must be True or False")

    @property
    def frame_limit(self) -> int:
        """The effective maximum frame payload accepted from a peer."""
        return self.max_frame_bytes or self.buffer_size

    def replace(self, **changes: Any) -> ShuffleConfig:
        """A copy with ``changes`` applied (and validated)."""
        return dataclasses.replace(self, **changes)


def _check_range(name: str, value: float, low: float, high: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ShuffleConfigError(f"{name}={value!r} is out of range: allowed {low} <= {name} <= {high}")
