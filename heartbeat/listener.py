"""``HeartbeatListener``: what the owner of a heartbeat manager is told (Flink's three callbacks + one)."""

from __future__ import annotations

from typing import Protocol, TypeVar

I_contra = TypeVar("I_contra", contravariant=True)
O_co = TypeVar("O_co", covariant=True)


class HeartbeatListener(Protocol[I_contra, O_co]):
    """Callbacks run on the manager's scheduler thread; keep them short and non-blocking.

    ``I`` is the payload received from targets, ``O`` the payload sent to them.
    """

    def notify_heartbeat_timeout(self, target_id: str) -> None:
        """No heartbeat arrived from ``target_id`` within the timeout (fires once per monitor)."""
        ...

    def notify_target_unreachable(self, target_id: str) -> None:
        """``rpc_failure_threshold`` consecutive RPCs to ``target_id`` failed (fires once per monitor)."""
        ...

    def report_payload(self, target_id: str, payload: I_contra) -> None:
        """A heartbeat from ``target_id`` carried ``payload``."""
        ...

    def retrieve_payload(self, target_id: str) -> O_co:
        """The payload to send to ``target_id`` with the next request or answer."""
        ...
