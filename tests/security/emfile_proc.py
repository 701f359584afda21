"""A control server whose process runs out of file descriptors, for the accept-loop test.

Starts a ``ControlServer`` (1 s handshake deadline), then lowers its own ``RLIMIT_NOFILE`` so that
only ``spare`` more descriptors can be opened: connections beyond that make ``accept()`` fail with
``EMFILE``. The secret comes on stdin. Prints its address, then answers ``refusals`` / ``quit``.

    python -m tests.security.emfile_proc <spare>
"""

from __future__ import annotations

import json
import logging
import os
import resource
import sys

from arrow_shuffle.config import ShuffleConfig
from arrow_shuffle.control_server import ControlServer
from tests.security.attack import ECHO, handlers


def main() -> int:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
    spare = int(sys.argv[1])
    secret = sys.stdin.readline().strip()
    config = ShuffleConfig(connect_timeout_s=1.0, peer_timeout_s=2.0, keepalive_interval_s=0.2)
    server = ControlServer(secret, ECHO, handlers(), config=config)
    print(json.dumps(server.address), flush=True)
    highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 1 + spare, hard))
    for line in sys.stdin:
        if line.strip() == "refusals":
            print(json.dumps(server.refusals()), flush=True)
        elif line.strip() == "quit":
            break
    server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
