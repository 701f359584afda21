"""``python -m spark_plugin pack -o env.tar.gz``: this virtual environment as an archive for
executors that have no arrowbeat installed (PySpark's ``--archives env.tar.gz#env`` convention).

Spark unpacks the archive into each executor's working directory; ``./env/bin/python`` then runs
the PySpark workers and arrowbeat's agent there (the JVM resolves ``spark.arrowbeat.python``
against the executor's working directory). What the archive leaves out, and why:

- Spark's jars (``pyspark/jars``, ~440 MB): executors run their own Spark, and their Python
  workers import pyspark from Spark's ``pyspark.zip`` first. pyspark's Python modules stay (a few
  MB): the agent imports them.
- Nothing else: the environment must be a plain venv with arrowbeat installed from a wheel (an
  editable install points into a source checkout the executors do not have: refused).

Like ``venv-pack``'s archives, a venv's ``bin/python`` is a link to the interpreter it was created
from: that interpreter must exist at the same path on the executors (it is printed).
Scripts in ``bin/`` get a shebang that finds the ``python`` beside them wherever it is unpacked.
"""

from __future__ import annotations

import io
import json
import os
import sys
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from spark_plugin.errors import SetupError

# Paths under site-packages that executors never need (see the module docstring).
EXCLUDED = ("pyspark/jars", "pyspark/work", "pyspark/examples")
# pip's shebang for scripts that must run wherever they are unpacked: sh execs the python beside it.
RELOCATABLE_SHEBANG = (
    b'#!/bin/sh\n\'\'\'exec\' "$(dirname -- "$(realpath -- "$0")")"/python "$0" "$@"\n\' \'\'\'\n'
)


@dataclass(frozen=True)
class Packed:
    """What ``pack`` wrote: the archive, its size, and the interpreter executors must have."""

    archive: Path
    size_bytes: int
    files: int
    base_python: str


def pack(output: Path, prefix: Path | None = None) -> Packed:
    """Writes the venv at ``prefix`` (default: this interpreter's) to ``output``: ``.tar.gz``/``.tgz``
    gzip-compressed (fast level: the archive is copied once per executor), ``.tar`` plain."""
    prefix = Path(prefix or sys.prefix).absolute()
    check_packable(prefix)
    if output.name.endswith((".tar.gz", ".tgz")):
        mode, options = "w:gz", {"compresslevel": 1}
    elif output.name.endswith(".tar"):
        mode, options = "w", {}
    else:
        raise SetupError(f"{output}: the archive must end in .tar.gz, .tgz or .tar (Spark unpacks those)")
    site = site_packages(prefix)
    skipped = [site / part for part in EXCLUDED]
    files = 0
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(output.name + ".part")
    with tarfile.open(partial, mode, **options) as tar:  # type: ignore[call-overload]
        for path in walk(prefix, skipped):
            name = path.relative_to(prefix).as_posix()
            shebang = relocated_script(path, prefix) if path.parent == prefix / "bin" else None
            if shebang is None:
                tar.add(path, arcname=name, recursive=False)
            else:
                info = tar.gettarinfo(path, arcname=name)
                info.size = len(shebang)
                tar.addfile(info, io.BytesIO(shebang))
            files += 1
    partial.replace(output)
    base = os.path.realpath(prefix / "bin" / "python")
    return Packed(output, output.stat().st_size, files, base)


def check_packable(prefix: Path) -> None:
    """A venv whose arrowbeat is a real install (from a wheel), not an editable one."""
    if not (prefix / "pyvenv.cfg").is_file():
        raise SetupError(
            f"{prefix} is not a virtual environment (no pyvenv.cfg): create one with `python -m venv`, "
            "`pip install` arrowbeat's wheel into it, and run pack with its python"
        )
    site = site_packages(prefix)
    found = list(metadata.distributions(name="arrowbeat", path=[str(site)]))
    if not found:
        raise SetupError(f"arrowbeat is not installed in {prefix}: `pip install` its wheel there first")
    direct = found[0].read_text("direct_url.json")
    editable = bool(direct) and json.loads(direct or "{}").get("dir_info", {}).get("editable", False)
    if editable or not (site / "spark_plugin" / "__init__.py").is_file():
        raise SetupError(
            f"arrowbeat is installed in {prefix} in editable mode (it lives in a source checkout that "
            "executors do not have): pack a venv with arrowbeat installed from a wheel (`make wheel`, "
            "then `pip install dist/arrowbeat-*.whl`)"
        )


def site_packages(prefix: Path) -> Path:
    found = sorted(prefix.glob("lib/python3.*/site-packages"))
    if not found:
        raise SetupError(f"{prefix} has no lib/python3.*/site-packages")
    return found[0]


def walk(root: Path, skipped: list[Path]) -> Iterator[Path]:
    """Every entry under ``root`` (directories before their contents, symlinks not followed),
    sorted so two packs of one venv list the same members."""
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if here / d not in skipped)
        for name in sorted(dirnames) + sorted(filenames):
            path = here / name
            if path not in skipped:
                yield path


def relocated_script(path: Path, prefix: Path) -> bytes | None:
    """A ``bin/`` script's content with a shebang that works wherever the venv is unpacked, or
    None to keep the file as it is (binaries, links, scripts for another interpreter)."""
    if path.is_symlink() or not path.is_file():
        return None
    with path.open("rb") as handle:
        first = handle.readline(4096)
        if not first.startswith(b"#!" + str(prefix / "bin" / "python").encode()):
            return None
        return RELOCATABLE_SHEBANG + handle.read()
