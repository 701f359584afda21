"""Small typed bridges over grpc.aio names the installed type stubs do not declare."""

from __future__ import annotations

from typing import Final

import grpc.aio

EOF: Final[object] = grpc.aio.EOF  # type: ignore[attr-defined]
