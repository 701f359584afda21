"""Spark applications that tests and benchmarks both submit: ``hold_app.py`` (a job, then a hold
until a go file appears), ``timed_job_app.py`` (jobs of timed tasks, each started by a go file,
marking where and when each attempt ran) and ``GcPause.java`` (long full collections on demand,
for GC pauses); ``warm.py`` is the start such applications make before they say they are ready
(every executor registered, each with a started Python worker)."""

from __future__ import annotations

import subprocess
from pathlib import Path

APPS = Path(__file__).resolve().parent
HOLD_APP = APPS / "hold_app.py"
TIMED_JOB_APP = APPS / "timed_job_app.py"
GC_PAUSE_SOURCE = APPS / "GcPause.java"


def gc_pause_jar(scratch: Path) -> Path:
    """``GcPause`` compiled and packed (once per ``scratch``) for ``--jars`` or a class path."""
    classes, jar = scratch / "gcpause-classes", scratch / "gcpause.jar"
    if not jar.exists():
        classes.mkdir(parents=True, exist_ok=True)
        subprocess.run(["javac", "--release", "17", "-d", str(classes), str(GC_PAUSE_SOURCE)], check=True)
        subprocess.run(["jar", "--create", "--file", str(jar), "-C", str(classes), "."], check=True)
    return jar
