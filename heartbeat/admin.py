"""A client for the RM's ``ListExecutors`` call: its live view of the executors, for operators,
demos and driver-side code. Same secret as everything else; a short deadline on every call."""

from __future__ import annotations

import grpc

from ._proto import heartbeat_pb2 as pb
from ._wire import SECRET_METADATA_KEY, SERVICE_NAME, message_size_options, status_from_proto
from .errors import HeartbeatAuthenticationError, HeartbeatRpcError
from .resource_manager import ExecutorInfo

LIST_EXECUTORS_METHOD = f"/{SERVICE_NAME}/ListExecutors"


def list_executors(address: str, secret: str, timeout_s: float = 5.0) -> list[ExecutorInfo]:
    """Every executor the RM at ``address`` knows, with state, agent pid and last payload."""
    with grpc.insecure_channel(address, options=message_size_options()) as channel:
        call = channel.unary_unary(
            LIST_EXECUTORS_METHOD,
            request_serializer=pb.ListExecutorsRequest.SerializeToString,
            response_deserializer=pb.ListExecutorsResponse.FromString,
        )
        try:
            reply = call(
                pb.ListExecutorsRequest(), timeout=timeout_s, metadata=((SECRET_METADATA_KEY, secret),)
            )
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            if code == grpc.StatusCode.UNAUTHENTICATED:
                raise HeartbeatAuthenticationError(f"the RM at {address} refused the secret") from exc
            raise HeartbeatRpcError(f"ListExecutors on {address} failed: {code}") from exc
    return [status_from_proto(s) for s in reply.executors]
