"""Arrow shuffle: a credit-based engine for Arrow record batches; it knows nothing of Spark.

The engine (every module directly in this package) knows nothing of Spark and imports neither
pyspark nor ``spark_plugin``. A producer writes record batches into a ``ResultPartition``
through a ``RecordWriter``; a ``PartitionServer`` serves the partition's subpartitions over TCP
to readers in other processes; a consumer reads through an ``InputGate`` whose channels
(``RemoteChannelSpec``: a ``PartitionServer``'s address and a subpartition) read with credits. See
``errors`` for the exception tree (the Spark side's included) and ``config.ShuffleConfig`` for
every setting.

Time: every object that measures it (``PartitionServer``, ``InputGate``, ``ResultPartition``,
``LocalBufferPool``) takes ``clock: arrowbeat_base.clock.Clock = SYSTEM_CLOCK`` as a keyword argument
and hands it to what it creates: the server to its connections and stream senders (keepalives,
peer timeout, time blocked on credit), the gate to its remote channels and their connections
(peer timeout) and its floating pool, the partition to its buffer pool (buffer-request timeout)
and its ``RecordWriter`` (flush timeout). Real waits (condition variables, socket ticks) only
pace how often a decision is re-read from the clock, so tests drive a ``ManualClock``.

The PySpark DataFrame API built on this engine (``repartition``, ``group_apply``, ...) lives in
the plugin, one layer up: ``spark_plugin.shuffle``. Nothing here imports it back.
"""

from typing import TYPE_CHECKING

from arrowbeat_base.lazy_exports import lazy_exports

if TYPE_CHECKING:  # imported on first use (``__getattr__``): a worker loads only what it needs
    from arrow_shuffle.buffer_pool import NetworkBufferPool
    from arrow_shuffle.config import ShuffleConfig
    from arrow_shuffle.errors import (
        BufferAccountingError,
        ChannelClosedError,
        ControlMessageError,
        ControlRequestError,
        CorruptDataError,
        CorruptFrameError,
        CreditViolationError,
        DeadlineExceededError,
        FrameChecksumError,
        InsufficientBuffersError,
        MapOutputLostError,
        OversizedFrameError,
        PartitionNotFoundError,
        PeerLostError,
        ProducerFailedError,
        RecordTooLargeError,
        RemoteFailureError,
        SchemaMismatchError,
        SequenceGapError,
        ShuffleAuthenticationError,
        ShuffleConfigError,
        ShuffleError,
        ShuffleProtocolError,
    )
    from arrow_shuffle.gate import InputGate, RemoteChannelSpec
    from arrow_shuffle.ids import PartitionId
    from arrow_shuffle.partition import ResultPartition
    from arrow_shuffle.partition_server import PartitionServer
    from arrow_shuffle.partitioner import Partitioner, column_partitioner, hash_partitioner
    from arrow_shuffle.stats import GateStats, PartitionStats
    from arrow_shuffle.writer import RecordWriter

__all__ = [
    "BufferAccountingError",
    "ChannelClosedError",
    "ControlMessageError",
    "ControlRequestError",
    "CorruptDataError",
    "CorruptFrameError",
    "CreditViolationError",
    "DeadlineExceededError",
    "FrameChecksumError",
    "GateStats",
    "InputGate",
    "InsufficientBuffersError",
    "MapOutputLostError",
    "NetworkBufferPool",
    "OversizedFrameError",
    "PartitionId",
    "PartitionNotFoundError",
    "PartitionServer",
    "PartitionStats",
    "Partitioner",
    "PeerLostError",
    "ProducerFailedError",
    "RecordTooLargeError",
    "RecordWriter",
    "RemoteChannelSpec",
    "RemoteFailureError",
    "ResultPartition",
    "SchemaMismatchError",
    "SequenceGapError",
    "ShuffleAuthenticationError",
    "ShuffleConfig",
    "ShuffleConfigError",
    "ShuffleError",
    "ShuffleProtocolError",
    "column_partitioner",
    "hash_partitioner",
]


_MOVED_TO_PLUGIN = frozenset(
    {
        "group_apply",
        "map_in_arrow",
        "partition_apply",
        "release",
        "repartition",
        "shuffle_of",
        "ShuffleHandle",
    }
)


_EXPORTS = {
    "NetworkBufferPool": "arrow_shuffle.buffer_pool",
    "ShuffleConfig": "arrow_shuffle.config",
    "BufferAccountingError": "arrow_shuffle.errors",
    "ChannelClosedError": "arrow_shuffle.errors",
    "ControlMessageError": "arrow_shuffle.errors",
    "ControlRequestError": "arrow_shuffle.errors",
    "CorruptDataError": "arrow_shuffle.errors",
    "CorruptFrameError": "arrow_shuffle.errors",
    "CreditViolationError": "arrow_shuffle.errors",
    "DeadlineExceededError": "arrow_shuffle.errors",
    "FrameChecksumError": "arrow_shuffle.errors",
    "InsufficientBuffersError": "arrow_shuffle.errors",
    "MapOutputLostError": "arrow_shuffle.errors",
    "OversizedFrameError": "arrow_shuffle.errors",
    "PartitionNotFoundError": "arrow_shuffle.errors",
    "PeerLostError": "arrow_shuffle.errors",
    "ProducerFailedError": "arrow_shuffle.errors",
    "RecordTooLargeError": "arrow_shuffle.errors",
    "RemoteFailureError": "arrow_shuffle.errors",
    "SchemaMismatchError": "arrow_shuffle.errors",
    "SequenceGapError": "arrow_shuffle.errors",
    "ShuffleAuthenticationError": "arrow_shuffle.errors",
    "ShuffleConfigError": "arrow_shuffle.errors",
    "ShuffleError": "arrow_shuffle.errors",
    "ShuffleProtocolError": "arrow_shuffle.errors",
    "InputGate": "arrow_shuffle.gate",
    "RemoteChannelSpec": "arrow_shuffle.gate",
    "PartitionId": "arrow_shuffle.ids",
    "ResultPartition": "arrow_shuffle.partition",
    "PartitionServer": "arrow_shuffle.partition_server",
    "Partitioner": "arrow_shuffle.partitioner",
    "column_partitioner": "arrow_shuffle.partitioner",
    "hash_partitioner": "arrow_shuffle.partitioner",
    "GateStats": "arrow_shuffle.stats",
    "PartitionStats": "arrow_shuffle.stats",
    "RecordWriter": "arrow_shuffle.writer",
}
"""Each public name and the module defining it: imported when the name is first used."""


def _moved_to_plugin(name: str) -> str:
    """Where a name of the DataFrame API lives, instead of a bare AttributeError."""
    if name in _MOVED_TO_PLUGIN:
        return (
            "arrow_shuffle is the engine only; the PySpark DataFrame API is in "
            f"spark_plugin.shuffle: from spark_plugin.shuffle import {name}"
        )
    return f"module 'arrow_shuffle' has no attribute {name!r}"


if not TYPE_CHECKING:  # for type checkers the names are the imports above: a misspelt one is an error
    __getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS, _moved_to_plugin)
