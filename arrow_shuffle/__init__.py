"""Arrow shuffle engine: result partitions, input gates and credit-based flow control.

Knows nothing of Spark. A producer writes record batches into a ``ResultPartition`` through a
``RecordWriter``; a ``ShuffleServer`` serves the partition's subpartitions; a consumer reads
them through an ``InputGate`` of local and remote channels. See ``errors`` for the exception
tree and ``config.ShuffleConfig`` for every setting.
"""

from typing import TYPE_CHECKING

from arrow_shuffle.buffer_pool import NetworkBufferPool
from arrow_shuffle.config import ShuffleConfig
from arrow_shuffle.errors import (
    AuthenticationError,
    BufferAccountingError,
    ChannelClosedError,
    ConfigError,
    CorruptFrameError,
    CreditViolationError,
    InsufficientBuffersError,
    OversizedFrameError,
    PartitionNotFoundError,
    PeerLostError,
    ProducerFailedError,
    ProtocolError,
    RecordTooLargeError,
    RemoteFailureError,
    SchemaMismatchError,
    SequenceGapError,
    ShuffleError,
)
from arrow_shuffle.gate import InputGate, LocalChannelSpec, RemoteChannelSpec
from arrow_shuffle.ids import PartitionId
from arrow_shuffle.partition import PartitionKind, ResultPartition
from arrow_shuffle.partitioner import Partitioner, column_partitioner, hash_partitioner
from arrow_shuffle.server import ShuffleServer
from arrow_shuffle.stats import GateStats, PartitionStats
from arrow_shuffle.writer import RecordWriter

__all__ = [
    "AuthenticationError",
    "BufferAccountingError",
    "ChannelClosedError",
    "ConfigError",
    "CorruptFrameError",
    "CreditViolationError",
    "GateStats",
    "InputGate",
    "InsufficientBuffersError",
    "LocalChannelSpec",
    "NetworkBufferPool",
    "OversizedFrameError",
    "PartitionId",
    "PartitionKind",
    "PartitionNotFoundError",
    "PartitionStats",
    "Partitioner",
    "PeerLostError",
    "ProducerFailedError",
    "ProtocolError",
    "RecordTooLargeError",
    "RecordWriter",
    "RemoteChannelSpec",
    "RemoteFailureError",
    "ResultPartition",
    "SchemaMismatchError",
    "SequenceGapError",
    "ShuffleConfig",
    "ShuffleError",
    "ShuffleHandle",
    "ShuffleServer",
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
    from arrow_shuffle.dataframe import (
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
        from arrow_shuffle import dataframe

        return getattr(dataframe, name)
    raise AttributeError(f"module 'arrow_shuffle' has no attribute {name!r}")
