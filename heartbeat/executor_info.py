"""``ExecutorInfo``: one executor as the RM sees it, the record its server, its wire codec, its admin
client and the plugin's views all read (kept out of the RM so the wire does not import the RM)."""

from __future__ import annotations

from dataclasses import dataclass

from heartbeat.payload import Payload


@dataclass(frozen=True)
class ExecutorInfo:
    """A snapshot of one executor as the RM sees it; times are wall-clock epoch seconds."""

    executor_id: str
    host: str
    instance_id: str
    state: str
    registered_at: float
    last_heartbeat: float | None
    last_rtt_ms: float | None
    payload: Payload | None
    pid: int = 0  # the agent process's pid as it registered; 0 if it did not say
    detail: str = ""  # UNMONITORED: why the executor has no agent
