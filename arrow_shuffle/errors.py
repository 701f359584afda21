"""The one exception tree of the ``arrow_shuffle`` package: the engine and its Spark side.

Callers catch the branch they can act on. Transport-level exceptions (``OSError``,
``pyarrow.ArrowInvalid``) are always mapped into this tree with ``raise ... from exc``, so the
original stays in ``__cause__``::

    ShuffleError
    ├── ShuffleConfigError (also ValueError)  invalid setting; names the field and its allowed range
    ├── InsufficientBuffersError              a pool cannot reserve what a partition/gate needs
    ├── BufferAccountingError                 a buffer recycled twice (over-release) or to the wrong pool
    ├── SchemaMismatchError                   a batch's schema differs from the partition's
    ├── RecordTooLargeError                   one row does not fit in a network buffer
    ├── ShuffleAuthenticationError            wrong secret (either side), or no handshake
    ├── PartitionNotFoundError                unknown partition, released one, or another application's
    ├── ShuffleProtocolError                  the peer broke the wire protocol
    │   ├── SequenceGapError                  a buffer arrived out of order (gap or duplicate)
    │   ├── CorruptFrameError                 bad magic/type, or a payload that is not valid Arrow IPC
    │   │   └── FrameChecksumError            a data frame whose payload fails its checksum, or has none
    │   ├── OversizedFrameError               a frame larger than ``max_frame_bytes``
    │   ├── CreditViolationError              the sender sent a buffer without credit
    │   └── ControlMessageError               a control message outside its operation's schema
    ├── ChannelClosedError                    *we* closed it (close(), cancel); using it afterwards
    ├── ControlRequestError                   the peer understood a control request and refused it
    ├── PeerLostError                         *the peer* is gone: EOF, reset or peer timeout
    │   ├── RemoteFailureError                the peer reported an error on the stream
    │   │   └── ProducerFailedError           the producer aborted the partition; it will never end
    │   └── DeadlineExceededError             a handshake or call not done by its overall deadline
    ├── UnsafePathError                       a path not ours alone: foreign owner, writable by others,
    │   │                                     a symlink, or outside the directory it must be in
    │   └── UnsafeIdError                     an id that cannot be a path component ('..', '/', NUL, empty)
    ├── CorruptDataError                      stored bytes that do not verify (checksum) or do not decode
    └── MapOutputLostError                    (Spark side) map outputs a reduce task needs are gone

Every error about a stream names the partition and the peer (``describe``). The Spark side
(``spark_plugin.shuffle``) raises classes of this same tree (its control connections map
``OSError`` to ``PeerLostError`` too); ``MapOutputLostError`` is the one only it raises, chained
to the engine error or ``OSError`` that revealed the loss. The heartbeat library
(``heartbeat.errors``) and the plugin (``spark_plugin.errors``, e.g. a wrong
``spark.arrowbeat.*`` setting) have trees of their own; no class name repeats across them.
"""

from __future__ import annotations


class ShuffleError(Exception):
    """Root of every error raised by ``arrow_shuffle``."""


class ShuffleConfigError(ShuffleError, ValueError):
    """A configuration value is outside its allowed range."""


class InsufficientBuffersError(ShuffleError):
    """The network buffer pool cannot reserve the buffers a partition or gate requires."""


class BufferAccountingError(ShuffleError):
    """A buffer was released twice or to a pool that did not lend it (a bug, never ignored)."""


class SchemaMismatchError(ShuffleError):
    """A record batch's schema differs from the partition's schema."""


class RecordTooLargeError(ShuffleError):
    """A single row is larger than one network buffer; raise ``buffer_size``."""


class ShuffleAuthenticationError(ShuffleError):
    """The peer could not prove it holds the application's secret."""


class PartitionNotFoundError(ShuffleError):
    """The requested partition is not hosted here (never was, released, or another app's)."""


class ShuffleProtocolError(ShuffleError):
    """The peer broke the wire protocol; the stream is failed."""


class SequenceGapError(ShuffleProtocolError):
    """A buffer's sequence number is not the expected one (a gap or a duplicate)."""


class CorruptFrameError(ShuffleProtocolError):
    """A frame header or payload could not be decoded."""


class FrameChecksumError(CorruptFrameError):
    """A BUFFER frame's payload does not match the checksum its sender computed (damaged between the
    two processes), or carries none while this reader requires one. Names the stream, the
    buffer's sequence number and both checksums; nothing of the payload was decoded."""


class OversizedFrameError(ShuffleProtocolError):
    """A frame announced a length above the configured maximum."""


class CreditViolationError(ShuffleProtocolError):
    """A data buffer arrived although the receiver had announced no credit for it."""


class ControlMessageError(ShuffleProtocolError):
    """A control message is not one of the protocol's typed messages: not JSON, an unknown
    operation, a missing/unknown field, a wrong type, a value out of bounds or over the size cap.
    Names the operation and the peer; nothing of the message was acted on."""


class ControlRequestError(ShuffleError):
    """The peer understood a control request and refused it; carries the peer's reason."""


class ChannelClosedError(ShuffleError):
    """The channel, gate, partition or server was closed by us; it cannot be used again."""


class PeerLostError(ShuffleError):
    """The peer disappeared mid-stream: EOF, connection reset, or silence past ``peer_timeout_s``
    on the engine's clock (a hung peer keeps its socket open but stops sending keepalives)."""


class RemoteFailureError(PeerLostError):
    """The peer reported a failure on the stream and closed it."""


class ProducerFailedError(RemoteFailureError):
    """The producer failed or aborted its partition (writer abort); no end-of-partition will come.

    Raised to local and remote readers alike; what was read before it is not a complete output."""


class UnsafePathError(ShuffleError):
    """A shuffle path is not private to this user (owned by another uid, writable by group or
    others, a symlink, not a regular file) or lies outside the directory it must be in; the
    message names it (``arrow_shuffle.private_files``). Nothing is written through it or read from it."""


class UnsafeIdError(UnsafePathError):
    """An id that becomes a path component (application, executor, shuffle, attempt, partition)
    is empty, ``.``/``..``, overlong, or holds a separator, NUL or another character outside
    ``[A-Za-z0-9._-]``; the message names the id."""


class CorruptDataError(ShuffleError):
    """Stored shuffle bytes (a map-output file's segment) that fail their checksum, end early or do
    not decode: never handed to Arrow, and the output is recomputed rather than read again."""


class MapOutputLostError(ShuffleError):
    """Map outputs a reduce task needs are gone (their executor or agent died).

    Raised by ``spark_plugin.shuffle.worker.reduce_task``, naming the executor and the map
    partitions; Spark's task retry then recomputes them."""


class DeadlineExceededError(PeerLostError):
    """A handshake or control call did not complete by its overall deadline, fixed when it started
    (a silent, stopped or byte-dripping peer cannot extend it)."""


def describe(partition: object, peer: object) -> str:
    """The ``partition ... peer ...`` suffix every stream error carries."""
    return f"[partition {partition}, peer {peer}]"
