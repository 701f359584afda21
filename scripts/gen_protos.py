"""Regenerate the checked-in gRPC/protobuf modules: ``make proto``.

Every ``*.proto`` under the project's packages is compiled next to itself (``x_pb2.py``,
``x_pb2.pyi``, ``x_pb2_grpc.py``); ``python -m scripts.gen_protos PATH...`` compiles only the
given ones (so a change to one package's protocol regenerates nothing else). Generated imports
are rewritten to be package-relative so the modules work wherever the package is installed.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("heartbeat", "arrow_shuffle", "spark_plugin")


def generate(proto: Path) -> None:
    out = proto.parent
    include = str(protoc.__file__).rsplit("/", 1)[0] + "/_proto"
    rc = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{out}",
            f"-I{include}",
            f"--python_out={out}",
            f"--pyi_out={out}",
            f"--grpc_python_out={out}",
            str(proto),
        ]
    )
    if rc != 0:
        raise SystemExit(f"protoc failed on {proto}")
    grpc_module = out / f"{proto.stem}_pb2_grpc.py"
    text = grpc_module.read_text()
    text = re.sub(rf"^import {proto.stem}_pb2 as", f"from . import {proto.stem}_pb2 as", text, flags=re.M)
    grpc_module.write_text(text)


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    if given:
        protos = [Path(p).resolve() for p in given]
        missing = [str(p) for p in protos if p.suffix != ".proto" or not p.is_file()]
        if missing:
            raise SystemExit(f"not a .proto file: {', '.join(missing)}")
    else:
        protos = [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.proto"))]
    for proto in protos:
        generate(proto)
        print(f"generated {proto.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
