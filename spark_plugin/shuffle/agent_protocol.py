"""The control schema of an executor's shuffle agent: what ``agent_service.MapOutputService``
serves and ``agent_client.MapOutputClient`` calls, over the engine's typed control protocol
(``arrow_shuffle.control_schema``). Both ends import it from here; neither imports the other.
"""

from __future__ import annotations

from arrow_shuffle.control_schema import (
    I32,
    I64,
    PARTITION_ID,
    Bytes,
    Float,
    Int,
    List,
    Map,
    Null,
    Operation,
    Record,
    Service,
    Str,
    Tuple,
)

MAX_SCHEMA_BYTES = 1 << 20
"""Largest Arrow IPC schema a ``stage`` request may carry (thousands of columns fit)."""
MAX_STAGE_BYTES = 8 << 20
"""Largest ``stage`` request: the schema plus every map output file and segment of one reducer."""
_SEGMENT = Tuple((Int(0, I64), Int(0, I64), List(Int(0, 0xFFFFFFFF), 1 << 16)))
"""``map_output.Segment``: offset, length and the checksum of each chunk (empty: unchecked)."""
_FILE = Tuple((Str(4096, 1), List(_SEGMENT, 1 << 20)))
AGENT_CONTROL = Service(
    "arrowbeat-agent-control",
    (
        Operation(
            "stage",
            Record(
                {
                    "shuffle": Int(0, I32),
                    "reducer": Int(0, I32),
                    "schema": Bytes(MAX_SCHEMA_BYTES),
                    "files": List(_FILE, 1 << 16),
                }
            ),
            PARTITION_ID,
            max_request_bytes=MAX_STAGE_BYTES,
        ),
        Operation("unstage", Record({"partition": PARTITION_ID}), Null()),
        Operation("release", Record({"shuffle": Int(0, I32)}), Int(0, I64), timeout_s=120.0),
        Operation("metrics", Record({}), Map(Float(), 256)),
        Operation(
            "report_lost",
            Record({"shuffle": Int(0, I32), "paths": List(Str(4096, 1), 1 << 12)}),
            Int(0, 1),
        ),
        Operation(
            "carried_lost",
            Record({"shuffle": Int(0, I32), "owners": List(Str(256, 1), 1 << 12)}),
            Int(0, 1),
        ),
        Operation(
            "report_corrupt",
            Record({"shuffle": Int(0, I32), "path": Str(4096, 1), "detail": Str(1000)}),
            Int(0, 2),
        ),
        Operation(
            "corrupt_outputs",
            Record({"shuffle": Int(0, I32)}),
            List(Tuple((Int(-1, I32), Str(4096, 1), Str(1000))), 1 << 10),
        ),
    ),
)
"""The agent's control operations: what ``MapOutputService`` serves and ``MapOutputClient`` calls."""
