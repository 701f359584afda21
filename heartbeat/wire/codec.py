"""Wire constants and conversions between ``Payload`` and its protobuf form."""

from __future__ import annotations

import math

from heartbeat.errors import (
    HeartbeatProtocolError,
    MalformedMessageError,
    ProtocolVersionError,
    StaleEpochError,
    StaleInstanceError,
    UnknownExecutorError,
)
from heartbeat.executor_info import ExecutorInfo
from heartbeat.payload import (
    MAX_NOTICE_DETAIL_CHARS,
    MAX_NOTICES,
    NOTICE_KINDS,
    Notice,
    Payload,
    WorkProgress,
)
from heartbeat.wire.proto import heartbeat_pb2 as pb
from heartbeat.wire.text import MAX_METRIC_NAME_CHARS, MAX_REASON_CHARS, check_text, one_line

SERVICE_NAME = "arrowbeat.heartbeat.ResourceManager"
CONNECT_METHOD = f"/{SERVICE_NAME}/Connect"
HELLO_METHOD = f"/{SERVICE_NAME}/Hello"
LIST_EXECUTORS_METHOD = f"/{SERVICE_NAME}/ListExecutors"
CALL_TOKEN_KEY = "x-arrowbeat-call"  # a unary call's token (``_auth.call_token``), never the secret
CALL_PROOF_KEY = "x-arrowbeat-proof"  # the RM's proof on a unary reply, in trailing metadata
MAX_MESSAGE_BYTES = 1 << 20
MAX_METRICS = 256
MAX_WORK = 256
"""Most units of work one payload describes (the agent puts stuck and idlest first)."""
MAX_WORK_LABEL_CHARS = 256
MAX_WHERE_CHARS = 4096
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
        work=[
            pb.WorkProgress(
                id=w.id, label=w.label, running_s=w.running_s, idle_s=w.idle_s, stuck=w.stuck, where=w.where
            )
            for w in payload.work[:MAX_WORK]
        ],
        notices=[pb.Notice(id=n.id, kind=n.kind, detail=n.detail) for n in payload.notices[:MAX_NOTICES]],
    )


def payload_from_proto(message: pb.Payload) -> Payload:
    if len(message.metrics) > MAX_METRICS:
        raise MalformedMessageError(
            f"payload has {len(message.metrics)} metrics; at most {MAX_METRICS} allowed"
        )
    for name in message.metrics:  # recorded in the history tables: checked like ids
        check_text("metric name", name, MAX_METRIC_NAME_CHARS)
    if len(message.work) > MAX_WORK:
        raise MalformedMessageError(
            f"payload has {len(message.work)} units of work; at most {MAX_WORK} allowed"
        )
    for w in message.work:  # recorded in the history tables: checked like ids
        check_text("work id", w.id)
        check_text("work label", w.label, MAX_WORK_LABEL_CHARS)
        check_text("work where", w.where, MAX_WHERE_CHARS, allow_empty=True)
        if not (math.isfinite(w.running_s) and math.isfinite(w.idle_s)) or min(w.running_s, w.idle_s) < 0:
            raise MalformedMessageError(f"work {w.id}: running_s and idle_s must be finite and >= 0")
    if len(message.notices) > MAX_NOTICES:
        raise MalformedMessageError(
            f"payload has {len(message.notices)} notices; at most {MAX_NOTICES} allowed"
        )
    for n in message.notices:  # recorded in the history tables: checked like ids
        check_text("notice id", n.id)
        check_text("notice kind", n.kind)
        check_text("notice detail", n.detail, MAX_NOTICE_DETAIL_CHARS, allow_empty=True)

    def opt(value: int) -> int | None:
        return None if value < 0 else value

    return Payload(
        slots_total=opt(message.slots_total),
        slots_busy=opt(message.slots_busy),
        running_tasks=opt(message.running_tasks),
        rss_bytes=opt(message.rss_bytes),
        jvm_pulse_age_ms=opt(message.jvm_pulse_age_ms),
        metrics=dict(message.metrics),
        work=tuple(
            WorkProgress(w.id, w.label, w.running_s, w.idle_s, w.stuck, w.where) for w in message.work
        ),
        # A kind this side does not know (a newer agent's) is dropped, not refused: the heartbeat
        # that proves the executor alive must not fail over a notice, nor a peer invent an event.
        notices=tuple(Notice(n.id, n.kind, n.detail) for n in message.notices if n.kind in NOTICE_KINDS),
    )


def status_name_for(error: HeartbeatProtocolError) -> str:
    """The gRPC status (by name, so this module needs no grpc import) that reports ``error``."""
    if isinstance(error, UnknownExecutorError):
        return "NOT_FOUND"
    if isinstance(error, StaleEpochError | ProtocolVersionError):
        return "FAILED_PRECONDITION"
    if isinstance(error, StaleInstanceError):
        return "ALREADY_EXISTS"  # a newer registration won: final for the agent, unlike the above
    return "INVALID_ARGUMENT"


def status_to_proto(info: ExecutorInfo) -> pb.ExecutorStatus:
    """One row of ``ListExecutors``."""
    return pb.ExecutorStatus(
        executor_id=info.executor_id,
        host=info.host,
        pid=info.pid,
        instance_id=info.instance_id,
        state=info.state,
        registered_at=info.registered_at,
        last_heartbeat=info.last_heartbeat or 0.0,
        last_rtt_ms=UNKNOWN if info.last_rtt_ms is None else info.last_rtt_ms,
        payload=payload_to_proto(info.payload) if info.payload is not None else None,
        detail=info.detail,
    )


def status_from_proto(status: pb.ExecutorStatus) -> ExecutorInfo:
    return ExecutorInfo(
        executor_id=status.executor_id,
        host=status.host,
        instance_id=status.instance_id,
        state=status.state,
        registered_at=status.registered_at,
        last_heartbeat=status.last_heartbeat or None,
        last_rtt_ms=None if status.last_rtt_ms < 0 else status.last_rtt_ms,
        payload=payload_from_proto(status.payload) if status.HasField("payload") else None,
        pid=status.pid,
        detail=one_line(status.detail, MAX_REASON_CHARS),
    )
