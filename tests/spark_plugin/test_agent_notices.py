"""The executor agent's side of ``SHUFFLE_CORRUPT``, without Spark: a damaged map output the agent's
shuffle service handles becomes a notice on the agent's board, which its heartbeat payload carries
(``processes.executor`` wires the board; ``test_driver_notices`` takes it from there)."""

from __future__ import annotations

import os
from pathlib import Path

from heartbeat import ManualClock, NoticeBoard
from heartbeat.payload import collect_payload
from spark_plugin.processes.executor import LazyShuffleService
from spark_plugin.settings.config import load

SECRET = "0123456789abcdef-secret"


def test_a_damaged_output_found_by_the_agent_is_carried_in_its_payload(tmp_path: Path) -> None:
    board = NoticeBoard(ManualClock())
    config = load(
        {"spark.arrowbeat.authenticate.secret": SECRET, "spark.arrowbeat.shuffle.dir": str(tmp_path)}
    )

    def on_corrupt(detail: str) -> None:  # as processes.executor.main posts it
        board.add("SHUFFLE_CORRUPT", detail)

    lazy = LazyShuffleService(
        config, {"spark.app.id": "app-1"}, "4", "127.0.0.1", walk=lambda _service: 0, on_corrupt=on_corrupt
    )
    lazy.start_when_app_known(link=None)  # type: ignore[arg-type]  # the id is known: no link needed
    try:
        service = lazy._service
        assert service is not None, "the shuffle service started"
        damaged = Path(service.root) / "m5-2.42.0-0a1b2c3d.arrows"
        damaged.write_bytes(b"not arrow")
        service.corrupt.handle(3, str(damaged), "checksum mismatch in segment 0", released=True)
        payload = collect_payload([lazy.metrics, board])
    finally:
        lazy.close()
    assert [n.kind for n in payload.notices] == ["SHUFFLE_CORRUPT"]
    detail = payload.notices[0].detail
    assert "executor 4" in detail and str(damaged) in detail and "shuffle 3" in detail, detail
    assert payload.metrics["shuffle_outputs_corrupt"] == 1.0  # the figure behind shuffle.corruptOutputs
    assert not os.path.exists(damaged)
