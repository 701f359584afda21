"""The one exception tree of the heartbeat package.

::

    HeartbeatError
    ├── HeartbeatConfigError (also ValueError)  invalid interval/timeout/threshold/retry settings
    ├── ClosedError                             we stopped it; the call came after stop()
    ├── AgentFailedError                        the agent's own code failed unexpectedly (final)
    ├── HeartbeatRpcError                       the peer is gone or the transport failed
    ├── RegistrationError                       an agent could not (or must no longer) register
    │   ├── RegistrationTimeoutError            retries ran past the policy's deadline
    │   ├── HeartbeatAuthenticationError        a proof of the shared secret failed (retried)
    │   └── RegistrationReplacedError           another agent registered our executor id (final)
    └── HeartbeatProtocolError                  the RM refused a message; nothing was applied
        ├── MalformedMessageError               gRPC INVALID_ARGUMENT (RESOURCE_EXHAUSTED: too big)
        ├── UnknownExecutorError                gRPC NOT_FOUND: register again
        ├── StaleEpochError                     gRPC FAILED_PRECONDITION: the RM restarted
        ├── StaleInstanceError                  gRPC ALREADY_EXISTS: a newer registration won
        └── ProtocolVersionError                gRPC FAILED_PRECONDITION: another wire version

The RM reports a refused message with the gRPC status on its right (``wire.codec.status_name_for``).
The agent reads a status back into the tree (``agent.core.error_for_status``): UNAUTHENTICATED
as ``HeartbeatAuthenticationError``, ALREADY_EXISTS as ``RegistrationReplacedError`` (final for
the agent: it stops instead of registering again), FAILED_PRECONDITION as ``ProtocolVersionError``,
``StaleEpochError`` or ``StaleInstanceError``, and any status not drawn here as
``HeartbeatRpcError``. Before the RM has proved that it knows the secret, no status is final for
the agent (a process squatting the RM's port could send any), so a registration attempt retries
even ALREADY_EXISTS or INVALID_ARGUMENT then, as a ``HeartbeatRpcError``.

"We closed it" (``ClosedError``) and "the peer is gone" (``HeartbeatRpcError``) are kept apart on
purpose: the first is a caller bug, the second is the normal failure the protocol detects.
"""

from __future__ import annotations


class HeartbeatError(Exception):
    """Base of every error raised by the heartbeat package."""


class HeartbeatConfigError(HeartbeatError, ValueError):
    """A configuration value is outside its allowed range; the message names both."""

    def __init__(self, parameter: str, value: object, allowed: str) -> None:
        super().__init__(f"invalid heartbeat setting {parameter}={value!r}: must be {allowed}")
        self.parameter = parameter
        self.value = value
        self.allowed = allowed


class ClosedError(HeartbeatError):
    """The object was stopped by its owner; create a new one instead of reusing it."""


class AgentFailedError(HeartbeatError):
    """An unexpected exception ended the agent (a bug, or a broken environment): kept as the
    agent's error with the original as ``__cause__``, so the process hosting it can end loudly
    and be restarted instead of running on silently unmonitored."""


class HeartbeatRpcError(HeartbeatError):
    """Sending to or receiving from the peer failed; counts toward UNREACHABLE."""


class RegistrationError(HeartbeatError):
    """The agent could not register with the ResourceManager."""


class RegistrationTimeoutError(RegistrationError):
    """Registration kept failing until the retry policy's overall deadline passed."""

    def __init__(
        self, address: str, deadline_s: float, attempts: int, last_error: BaseException | None
    ) -> None:
        super().__init__(
            f"could not register with the ResourceManager at {address} within {deadline_s:.1f} s "
            f"({attempts} attempts; last error: {last_error!r}); check that the driver-side RM is running "
            "and reachable, or raise the registration deadline"
        )
        self.address = address
        self.deadline_s = deadline_s
        self.attempts = attempts
        self.last_error = last_error


class HeartbeatAuthenticationError(RegistrationError):
    """A proof of the shared secret failed: the RM refused ours, or the server did not prove it.

    The two cannot be told apart from the agent (an RM given another secret and a process
    squatting the RM's port look the same), so registration retries it until its deadline:
    when the real RM is back on the address, the agent registers. Every process of one
    application must share the same secret.
    """


class RegistrationReplacedError(RegistrationError):
    """A newer registration of the same executor id replaced ours; the agent stops for good.

    Registering again would replace the newer agent in turn, and two live agents sharing one
    executor id would then replace each other forever, so the newer registration wins.
    """


class HeartbeatProtocolError(HeartbeatError):
    """The RM refused a message (it was not applied); the sender should re-register or fix it."""


class MalformedMessageError(HeartbeatProtocolError):
    """The message could not be parsed or violates a field constraint."""


class UnknownExecutorError(HeartbeatProtocolError):
    """The RM has no live registration for this executor id (timed out, unregistered or restarted)."""


class StaleEpochError(HeartbeatProtocolError):
    """The message carries an epoch of an earlier RM incarnation."""


class StaleInstanceError(HeartbeatProtocolError):
    """The message carries a registration (instance) id that a newer registration replaced."""


class ProtocolVersionError(HeartbeatProtocolError):
    """The two sides speak different heartbeat wire versions; the message names both.

    Every process of one application must run the same arrowbeat. Registration retries it (an
    unproven server could claim any version) until its deadline.
    """
