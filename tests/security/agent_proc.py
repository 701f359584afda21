"""A real executor agent's shuffle side, as a separate process for the attack tests.

Runs a ``MapOutputService`` (data port + control port) with one map output file already written,
and the driver's pipelined ``Rendezvous`` (control port), with short deadlines. The secret comes
on stdin (never argv). Prints one JSON line of addresses; then answers stdin commands:
``refusals`` (one JSON line: refusals by cause per port), ``quit``. Logs go to stderr.

    python -m tests.security.agent_proc <root>
"""

from __future__ import annotations

import json
import logging
import os
import sys

import pyarrow as pa

from arrow_shuffle.config import ShuffleConfig
from spark_plugin.shuffle.agent.service import MapOutputService
from spark_plugin.shuffle.driver.rendezvous import Rendezvous
from spark_plugin.shuffle.map_output import MapOutputWriter
from tests.security.attack import APP

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string())])
ROWS = 20_000
CONFIG = ShuffleConfig(
    buffer_size=64 * 1024,
    network_memory_bytes=8 << 20,
    connect_timeout_s=2.0,
    keepalive_interval_s=0.2,
    peer_timeout_s=2.0,
)
"""Handshake deadline 2 s: the attack tests see refusals quickly."""


def main() -> int:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
    root = sys.argv[1]
    secret = sys.stdin.readline().strip()
    service = MapOutputService(APP, "1", secret, root, jvm_pid=os.getpid(), config=CONFIG)
    rendezvous = Rendezvous(secret, config=CONFIG)
    path = os.path.join(service.dir, "s3", "m0.arrows")
    writer = MapOutputWriter(path, SCHEMA, ["k"], 1, 1 << 30)
    writer.write(
        pa.record_batch([pa.array(range(ROWS)), pa.array([f"row-{i}" for i in range(ROWS)])], schema=SCHEMA)
    )
    [output] = writer.finish()
    print(
        json.dumps(
            {
                "data": service.data_address,
                "control": service.control_address,
                "rendezvous": rendezvous.address,
                "path": path,
                "segments": output.segments,
                "pid": os.getpid(),
            }
        ),
        flush=True,
    )
    for line in sys.stdin:
        command = line.strip()
        if command == "refusals":
            figures = {
                "data": service.server.acceptor.refusals(),
                "control": service.control.refusals(),
                "rendezvous": rendezvous.server.refusals(),
            }
            print(json.dumps(figures), flush=True)
        elif command == "quit":
            break
    rendezvous.close()
    service.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
