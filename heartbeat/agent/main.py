"""Run one agent as a process: ``python -m heartbeat.agent.main --rm HOST:PORT --executor-id ID``.

The secret comes from ``--secret-file PATH`` (a file only its owner may read, or ``-`` for one
line on stdin) or else the ``ARROWBEAT_SECRET`` environment variable (removed from this
process's environment once read, so no child inherits it), never from argv (argv is visible in
``ps``); it is held as a ``SharedSecret`` that no repr or log line shows.

Prints ``READY <epoch> <instance_id>`` on the first registration and ``REGISTERED <epoch>
<instance_id>`` on each later one; exits on SIGTERM/SIGINT after unregistering, or with status
2, the cause on stderr, if the agent ends any other way (a ``--retry-deadline`` passed, a newer
agent registered its executor id, an unexpected failure) or a setting is invalid.

Settings come from the command line only, never from a table of configuration keys. The RM
announces its interval and timeout when the agent registers, and the agent watches the RM with
those; ``--interval`` and ``--timeout`` (default: ``HeartbeatServices``' own) only rule before
the first registration (how often an unhealthy agent checks again, the registration attempt's
timeout) and stand in if an RM announces none.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import MutableMapping

from heartbeat.agent.async_agent import AsyncAgent
from heartbeat.agent.core import Registration
from heartbeat.errors import HeartbeatConfigError
from heartbeat.payload import rss_provider, slots_provider
from heartbeat.retry import RetryPolicy
from heartbeat.services import HeartbeatServices
from heartbeat.wire.auth import SharedSecret

SECRET_ENV = "ARROWBEAT_SECRET"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rm", required=True, help="the ResourceManager's HOST:PORT")
    parser.add_argument("--executor-id", required=True)
    parser.add_argument(
        "--secret-file",
        help=f"read the shared secret from this file (owner-only), '-' for stdin; default: ${SECRET_ENV}",
    )
    parser.add_argument("--host", default="127.0.0.1", help="this executor's host name as reported to the RM")
    parser.add_argument("--interval", type=float, help="heartbeat interval, s, until the RM announces one")
    parser.add_argument("--timeout", type=float, help="heartbeat timeout, s, until the RM announces one")
    parser.add_argument(
        "--rpc-failure-threshold", type=int, help="failed answers in a row that end a session"
    )
    parser.add_argument("--slots", type=int, default=1)
    parser.add_argument("--retry-min", type=float, default=0.05, help="min registration backoff, s")
    parser.add_argument("--retry-max", type=float, default=1.0, help="max registration backoff, s")
    parser.add_argument(
        "--retry-deadline",
        type=float,
        default=None,
        help="give up registering after, s (then exit with status 2); default: never give up",
    )
    return parser.parse_args(argv)


def settings(args: argparse.Namespace) -> tuple[HeartbeatServices, RetryPolicy]:
    """The validated settings the flags give, unset ones at the library's defaults."""
    given = {
        "interval_s": args.interval,
        "timeout_s": args.timeout,
        "rpc_failure_threshold": args.rpc_failure_threshold,
    }
    services = HeartbeatServices(**{name: value for name, value in given.items() if value is not None})
    policy = RetryPolicy(
        min_delay_s=args.retry_min,
        max_delay_s=args.retry_max,
        deadline_s=args.retry_deadline,
        attempt_timeout_s=min(5.0, services.timeout_s),
    )
    return services, policy


class SecretError(Exception):
    """The secret could not be read; the message names where from, never the secret."""


def read_secret(secret_file: str | None, environ: MutableMapping[str, str] = os.environ) -> SharedSecret:
    """The secret from ``secret_file`` (``-``: stdin) or else the environment (then removed from it)."""
    if secret_file is None:
        value = environ.pop(SECRET_ENV, "")
        if not value:
            raise SecretError(
                f"set the shared secret in the {SECRET_ENV} environment variable or pass --secret-file"
            )
        return SharedSecret(value)
    if secret_file == "-":
        value = sys.stdin.readline().rstrip("\r\n")
    else:
        try:
            fd = os.open(secret_file, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as exc:
            raise SecretError(f"cannot open the secret file {secret_file}: {exc.strerror}") from None
        with os.fdopen(fd, "r", encoding="utf-8") as file:
            info = os.fstat(file.fileno())
            if info.st_uid != os.geteuid() or info.st_mode & 0o077:
                raise SecretError(
                    f"the secret file {secret_file} must be owned by this user and readable by no one else "
                    f"(mode {info.st_mode & 0o777:o}; chmod 600 it)"
                )
            value = file.readline().rstrip("\r\n")
    if not value:
        raise SecretError(f"the secret file {secret_file} holds no secret")
    return SharedSecret(value)


async def _main(
    services: HeartbeatServices, policy: RetryPolicy, args: argparse.Namespace, secret: SharedSecret
) -> int:
    first = True

    def announce(registration: Registration) -> None:
        nonlocal first
        word = "READY" if first else "REGISTERED"
        first = False
        print(f"{word} {registration.epoch} {registration.instance_id}", flush=True)

    agent = AsyncAgent(
        args.rm,
        secret,
        args.executor_id,
        host=args.host,
        services=services,
        payload_providers=[slots_provider(args.slots), rss_provider()],
        retry_policy=policy,
        on_registered=announce,
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: asyncio.ensure_future(agent.stop()))
    await agent.run()
    if agent.error is not None:
        print(f"FAILED {agent.error}", file=sys.stderr, flush=True)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        secret = read_secret(args.secret_file)
    except SecretError as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        services, policy = settings(args)
    except HeartbeatConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return asyncio.run(_main(services, policy, args, secret))


if __name__ == "__main__":
    sys.exit(main())
