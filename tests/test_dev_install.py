"""The checkout's venv behaves as a user's (issue 38, item 8): ``make setup``'s editable install
carries ``arrowbeat.pth``, the start-up line of ``spark.arrowbeat.shuffle.groupedMap``, as the wheel
does (``build_backend/arrowbeat_build.py``'s ``build_editable``). Before, the line was missing and an
unchanged ``applyInPandas`` job stayed on Spark's path in the checkout whatever the key said.

Without a JVM: the installed files, a fresh interpreter of this venv (as a user's script starts)
and the wheel surgery itself. ``tests/spark/test_dev_install_takeover.py`` runs the job."""

from __future__ import annotations

import base64
import hashlib
import importlib
import os
import sys
import sysconfig
import zipfile
from importlib import metadata
from pathlib import Path
from types import ModuleType

import pytest

from tests.installed import ROOT, clean_env, hook_probe

STARTUP_PTH = ROOT / "arrowbeat.pth"


def installed_file(name: str) -> Path | None:
    """Where this venv's arrowbeat installation put ``name``, as its ``RECORD`` lists it (the
    installation in site-packages: from the checkout, ``arrowbeat.egg-info`` is found first)."""
    site_packages = sysconfig.get_paths()["purelib"]
    (dist,) = metadata.distributions(path=[site_packages], name="arrowbeat")
    for entry in dist.files or ():
        if str(entry) == name:
            return Path(str(entry.locate()))
    return None


def test_the_installation_of_this_venv_carries_the_start_up_line() -> None:
    """Listed in the installation's RECORD (pip replaces or removes it with the install) and the
    checkout's own line, in site-packages where Python's ``site`` runs it."""
    path = installed_file("arrowbeat.pth")
    assert path is not None, "arrowbeat.pth is not part of this venv's arrowbeat: rerun make setup"
    assert path.parent.name == "site-packages" and path.read_bytes() == STARTUP_PTH.read_bytes()


def test_a_script_started_by_this_venvs_python_has_pysparks_grouped_maps_wrapped(tmp_path: Path) -> None:
    """A user's script, outside the checkout and without ``PYTHONPATH``: PySpark's grouped-map
    methods come wrapped (the key is read at each call) and no arrowbeat code was imported."""
    env = {**clean_env(), "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])}
    assert hook_probe(Path(sys.executable), tmp_path, env) == ["True", "True", "True", "False"]


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """``build_backend/arrowbeat_build.py`` as pip imports it (``backend-path`` on ``sys.path``)."""
    monkeypatch.syspath_prepend(str(ROOT / "build_backend"))
    return importlib.import_module("arrowbeat_build")


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def test_the_start_up_line_is_added_to_an_editable_wheel_and_its_record(
    backend: ModuleType, tmp_path: Path
) -> None:
    wheel = tmp_path / "arrowbeat-0.1.0-0.editable-py3-none-any.whl"
    record = "arrowbeat-0.1.0.dist-info/RECORD"
    finder = b"import __editable___arrowbeat_finder; __editable___arrowbeat_finder.install()"
    with zipfile.ZipFile(wheel, "w") as made:
        made.writestr("__editable__.arrowbeat-0.1.0.pth", finder)
        made.writestr("arrowbeat-0.1.0.dist-info/METADATA", "Name: arrowbeat\n")
        made.writestr(record, f"{record_line('__editable__.arrowbeat-0.1.0.pth', finder)}\n{record},,\n")
    line = STARTUP_PTH.read_bytes()
    for _ in range(2):  # a second pass replaces, never duplicates
        backend.add_to_wheel(wheel, "arrowbeat.pth", line)
    with zipfile.ZipFile(wheel) as done:
        names = done.namelist()
        assert sorted(names) == sorted(
            [
                "__editable__.arrowbeat-0.1.0.pth",
                "arrowbeat-0.1.0.dist-info/METADATA",
                record,
                "arrowbeat.pth",
            ]
        )
        assert done.read("arrowbeat.pth") == line
        assert done.read("__editable__.arrowbeat-0.1.0.pth") == finder
        rows = done.read(record).decode().splitlines()
    assert rows == [
        record_line("__editable__.arrowbeat-0.1.0.pth", finder),
        f"{record},,",
        record_line("arrowbeat.pth", line),
    ]


def test_pips_editable_hook_is_the_one_that_adds_it(backend: ModuleType) -> None:
    """PEP 660's ``build_editable`` is the backend's own (setuptools' alone left the line out)."""
    setuptools_backend = importlib.import_module("setuptools.build_meta")
    assert backend.build_editable is not setuptools_backend.build_editable
    assert backend.build_editable.__module__ == "arrowbeat_build"
