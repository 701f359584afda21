"""``HeartbeatTarget``: the peer a heartbeat manager talks to (Flink's ``HeartbeatTarget``)."""

from __future__ import annotations

from typing import Protocol, TypeVar

P_contra = TypeVar("P_contra", contravariant=True)


class HeartbeatTarget(Protocol[P_contra]):
    """Something that can be sent a heartbeat or asked for one.

    Both calls must not block: a transport enqueues and returns. A synchronous failure raises
    ``HeartbeatRpcError``; an asynchronous one is reported to the manager's ``report_rpc_failure``.
    """

    def receive_heartbeat(self, heartbeat_origin: str, payload: P_contra) -> None:
        """Deliver our heartbeat (answer) to this target."""
        ...

    def request_heartbeat(self, request_origin: str, payload: P_contra) -> None:
        """Ask this target to answer with its heartbeat."""
        ...
