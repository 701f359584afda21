"""Arrow shuffle: a credit-based engine, and (in ``arrow_shuffle.spark``) its PySpark DataFrame API.

The engine (every module directly in this package) knows nothing of Spark and imports neither
pyspark nor ``spark_plugin``. A producer writes record batches into a ``ResultPartition``
through a ``RecordWriter``; a ``PartitionServer`` serves the partition's subpartitions over TCP
to readers in other processes; a consumer reads through an ``InputGate`` whose channels are
*local* (``LocalChannelSpec``: a partition object in the same process, read from memory) or
*remote* (``RemoteChannelSpec``: a ``PartitionServer``'s address, read with credits). See
``errors`` for the exception tree (the Spark side's included) and ``config.ShuffleConfig`` for
every setting.

Time: every object that measures it (``PartitionServer``, ``InputGate``, ``ResultPartition``,
``LocalBufferPool``) takes ``clock: heartbeat.clock.Clock = SYSTEM_CLOCK`` as a keyword argument
and hands it to what it creates: the server to its connections and stream senders (keepalives,
peer timeout, time blocked on credit), the gate to its remote channels and their connections
(peer timeout) and its floating pool, the partition to its buffer pool (buffer-request timeout)
and its ``RecordWriter`` (flush timeout). Real waits (condition variables, socket ticks) only
pace how often a decision is re-read from the clock, so tests drive a ``ManualClock``.

``arrow_shuffle.spark`` holds everything Spark-specific (DataFrame API, task bodies, map-output
files, the agent's map-output service and its client, the pipelined rendezvous). Its public
DataFrame API is re-exported here lazily, so ``import arrow_shuffle`` needs no pyspark.
"""

from typing import TYPE_CHECKING

from arrow_shuffle.buffer_pool import NetworkBufferPool
from arrow_shuffle.config import ShuffleConfig
from arrow_shuffle.errors import (
    BufferAccountingError,
    ChannelClosedError,
    ControlMessageError,
    ControlRequestError,
    CorruptFrameError,
    CreditViolationError,
    DeadlineExceededError,
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
    SpillError,
)
from arrow_shuffle.gate import InputGate, LocalChannelSpec, RemoteChannelSpec
from arrow_shuffle.ids import PartitionId
from arrow_shuffle.partition import PartitionKind, ResultPartition
from arrow_shuffle.partition_server import PartitionServer
from arrow_shuffle.partitioner import Partitioner, column_partitioner, hash_partitioner
from arrow_shuffle.stats import GateStats, PartitionStats
from arrow_shuffle.writer import RecordWriter

__all__ = [
    "BufferAccountingError",
    "ChannelClosedError",
    "ControlMessageError",
    "ControlRequestError",
    "CorruptFrameError",
    "CreditViolationError",
    "DeadlineExceededError",
    "GateStats",
    "InputGate",
    "InsufficientBuffersError",
    "LocalChannelSpec",
    "MapOutputLostError",
    "NetworkBufferPool",
    "OversizedFrameError",
    "PartitionId",
    "PartitionKind",
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
    "ShuffleHandle",
    "ShuffleProtocolError",
    "SpillError",
    "column_partitioner",
    "group_apply",
    "hash_partitioner",
    "map_in_arrow",
    "partition_apply",
    "release",
    "repartition",
    "shuffle_of",
]

if TYPE_CHECKING:  # the real import is lazy (``__getattr__``): no pyspark for engine users
    from arrow_shuffle.spark import (
        ShuffleHandle,
        group_apply,
        map_in_arrow,
        partition_apply,
        release,
        repartition,
        shuffle_of,
    )

_DATAFRAME_API = (
    "group_apply",
    "map_in_arrow",
    "partition_apply",
    "release",
    "repartition",
    "shuffle_of",
    "ShuffleHandle",
)


def __getattr__(name: str) -> object:
    """The PySpark DataFrame API, imported on first use so ``import arrow_shuffle`` needs no pyspark."""
    if name in _DATAFRAME_API:
        from arrow_shuffle import spark

        return getattr(spark, name)
    raise AttributeError(f"module 'arrow_shuffle' has no attribute {name!r}")
