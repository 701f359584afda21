"""Wire constants and conversions between ``Payload`` and its protobuf form."""

from __future__ import annotations

from ._proto import heartbeat_pb2 as pb
from .errors import (
    MalformedMessageError,
    ProtocolError,
    StaleEpochError,
    StaleInstanceError,
    UnknownExecutorError,
)
from .payload import Payload

SECRET_METADATA_KEY = "x-arrowbeat-secret"
SERVICE_NAME = "arrowbeat.heartbeat.ResourceManager"
CONNECT_METHOD = f"/{SERVICE_NAME}/Connect"
MAX_MESSAGE_BYTES = 1 << 20
MAX_ID_CHARS = 256
MAX_METRICS = 256
UNKNOWN = -1


def message_size_options(max_bytes: int = MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    return [("grpc.max_receive_message_length", max_bytes), ("grpc.max_send_message_length", max_bytes)]


def payload_to_proto(payload: Payload) -> pb.Payload:
    def num(value: int | None) -> int:
        return UNKNOWN if value is None else value

    return pb.Payload(
        slots_total=num(payload.slots_total),
        slots_busy=num(payload.slots_busy),
        running_tasks=num(payload.running_tasks),
        rss_bytes=num(payload.rss_bytes),
        jvm_pulse_age_ms=num(payload.jvm_pulse_age_ms),
        metrics=payload.metrics,
    )


def payload_from_proto(message: pb.Payload) -> Payload:
    if len(message.metrics) > MAX_METRICS:
        raise MalformedMessageError(
            f"payload has {len(message.metrics)} metrics; at most {MAX_METRICS} allowed"
        )

    def opt(value: int) -> int | None:
        return None if value < 0 else value

    return Payload(
        slots_total=opt(message.slots_total),
        slots_busy=opt(message.slots_busy),
        running_tasks=opt(message.running_tasks),
        rss_bytes=opt(message.rss_bytes),
        jvm_pulse_age_ms=opt(message.jvm_pulse_age_ms),
        metrics=dict(message.metrics),
    )


def status_name_for(error: ProtocolError) -> str:
    """The gRPC status (by name, so this module needs no grpc import) that reports ``error``."""
    if isinstance(error, UnknownExecutorError):
        return "NOT_FOUND"
    if isinstance(error, StaleEpochError | StaleInstanceError):
        return "FAILED_PRECONDITION"
    return "INVALID_ARGUMENT"
