"""The RM and its agents over TLS on 127.0.0.1: registration, heartbeats and ListExecutors inside
TLS; an agent pinned to another certificate refuses the RM (never registers, never proves the
secret to it); a plaintext agent cannot reach a TLS RM."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from heartbeat import AgentThread, HeartbeatError, ResourceManagerServer, RetryPolicy
from heartbeat.rm.admin import list_executors
from spark_plugin.settings import tls

from .conftest import SECRET, STEADY
from .fakes import Collector, ServedRm, served_rm

pytestmark = pytest.mark.timeout(60)
RETRY = RetryPolicy(min_delay_s=0.02, max_delay_s=0.1, deadline_s=3.0, attempt_timeout_s=1.0)


@pytest.fixture(scope="module")
def material() -> tls.TlsMaterial:
    return tls.generate_self_signed()


@pytest.fixture
def rm(material: tls.TlsMaterial) -> Iterator[ServedRm]:
    with served_rm(STEADY, SECRET, server_credentials=tls.grpc_server_credentials(material)) as served:
        yield served


def agent(address: str, executor_id: str, material: tls.TlsMaterial | None) -> AgentThread:
    if material is None:
        return AgentThread(address, SECRET, executor_id, services=STEADY, retry_policy=RETRY)
    return AgentThread(
        address,
        SECRET,
        executor_id,
        services=STEADY,
        retry_policy=RETRY,
        channel_credentials=tls.grpc_channel_credentials(material),
        channel_options=tls.grpc_channel_options(material),
    )


def test_register_heartbeat_and_list_inside_tls(
    rm: tuple[ResourceManagerServer, str, Collector], material: tls.TlsMaterial
) -> None:
    _, address, events = rm
    a = agent(address, "1", material)
    try:
        a.start()
        assert a.wait_registered(10.0)
        assert events.wait_for(lambda: len(events.records) >= 2, 10.0)  # heartbeats answered
        [info] = list_executors(
            address,
            SECRET,
            channel_credentials=tls.grpc_channel_credentials(material),
            channel_options=tls.grpc_channel_options(material),
        )
        assert info.executor_id == "1" and info.state == "RUNNING"
        with pytest.raises(HeartbeatError):  # a plaintext admin client gets nothing
            list_executors(address, SECRET, timeout_s=2.0)
    finally:
        a.stop()


@pytest.mark.parametrize("pinned", ["other", "plaintext"])
def test_an_agent_pinned_to_another_certificate_or_plaintext_never_registers(
    rm: tuple[ResourceManagerServer, str, Collector], pinned: str
) -> None:
    server, address, events = rm
    a = agent(address, "2", tls.generate_self_signed() if pinned == "other" else None)
    try:
        a.start()
        assert not a.wait_registered(3.0)
        assert server.executors() == [] and events.records == []
    finally:
        a.stop()


def test_a_client_pinned_to_another_certificate_gets_unavailable(
    rm: tuple[ResourceManagerServer, str, Collector],
) -> None:
    _, address, _ = rm
    other = tls.generate_self_signed()
    with pytest.raises(HeartbeatError) as caught:
        list_executors(
            address,
            SECRET,
            timeout_s=2.0,
            channel_credentials=tls.grpc_channel_credentials(other),
            channel_options=tls.grpc_channel_options(other),
        )
    assert "UNAVAILABLE" in str(caught.value) or grpc.StatusCode.UNAVAILABLE.name in repr(caught.value)
