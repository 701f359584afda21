"""One launcher jar on every supported Spark (issue 22, item 2): it is compiled against the oldest
supported Spark's API (``build_backend/launcher_classpath.txt``) and loaded here on the running one.

- every Spark, Scala, metrics and slf4j member its bytecode links to exists on this Spark with the
  same descriptor, and every plugin or listener method it overrides still overrides one (checked
  with reflection by ``apps/LauncherProbe.java``, so nothing fails later at first use);
- its shim (``launcher/.../compat/SparkInternals.java``) finds every Spark internal it uses here,
  and its checks tell a changed signature from a matching one (on JDK classes);
- a real application with the plugin on: the driver and executor plugins start, the executor's
  agent registers and is told the executor's own local dirs, and no internal is reported
  unavailable; with every internal made unavailable (the shim's test switch) the application and
  its agent still run, and each internal is warned about once per JVM.
"""

from __future__ import annotations

import os
import re
import subprocess
import zipfile
from pathlib import Path

import pytest

from harness.apps import HOLD_APP
from harness.history_read import events, rows
from harness.procs import wait_until
from harness.submit import SubmittedApp, executor_dirs
from spark_plugin.jvm.launch import jar_paths
from spark_plugin.jvm.sidecar import JVM_UNAVAILABLE, unavailable_internals

APPS = Path(__file__).parent / "apps"
INTERNALS = ("executor-local-dirs", "executor-host", "kill-and-replace-executor")
TEST_SWITCH = "arrowbeat.test.unavailableInternals"
"""``SparkInternals.TEST_UNAVAILABLE_PROPERTY``: internals to treat as unavailable (tests only)."""
UNAVAILABLE_WARNING = "arrowbeat: unavailable on Spark"
WARNED_INTERNAL = re.compile(r"arrowbeat: unavailable on Spark \S+: (\S+) \(")
GENEROUS_S = 60.0
"""A deadline no loaded machine should reach (an agent registers within a few seconds)."""
EXECUTOR_LINE = re.compile(
    r"arrowbeat executor plugin on executor 0 \(Spark (?P<version>\S+)\): "
    r"host (?P<host>\S+) \(from the (?P<source>[^)]+)\), local dirs \[(?P<dirs>[^\]]*)\]"
)


def spark_version() -> str:
    import pyspark

    return str(pyspark.__version__)


def spark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "jars"


def launcher_jar() -> Path:
    """The launcher jar this run's applications load: the one of ``jar_paths()`` holding the plugin."""
    for jar in jar_paths():
        with zipfile.ZipFile(jar) as archive:
            if "arrowbeat/ArrowBeatPlugin.class" in archive.namelist():
                return Path(jar)
    raise AssertionError(f"no launcher jar among {jar_paths()}")


def launcher_classes(jar: Path) -> list[str]:
    with zipfile.ZipFile(jar) as archive:
        names = [n for n in archive.namelist() if n.startswith("arrowbeat/") and n.endswith(".class")]
    return sorted(n[: -len(".class")].replace("/", ".") for n in names)


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """``java`` with ``LauncherProbe`` compiled against the launcher jar and this Spark's jars:
    the command to which a mode is appended."""
    out = tmp_path_factory.mktemp("launcher-probe")
    classpath = os.pathsep.join([str(launcher_jar()), f"{spark_jars()}/*"])
    javac = ["javac", "-nowarn", "--release", "17", "-d", str(out), "-cp", classpath]
    subprocess.run([*javac, str(APPS / "LauncherProbe.java")], check=True)
    return ["java", "-Xmx256m", "-cp", os.pathsep.join([str(out), classpath]), "LauncherProbe"]


def run_probe(probe: list[str], *args: str, stdin: str = "") -> list[str]:
    done = subprocess.run([*probe, *args], input=stdin, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


POOL_MEMBER = re.compile(r"= (?:Methodref|InterfaceMethodref|Fieldref)\s+#\d+\.#\d+\s+// (\S+)$")
POOL_CLASS = re.compile(r"= Class\s+#\d+\s+// (\S+)$")
OURS = ("arrowbeat/", "java/", "javax/", "jdk/", "sun/", "com/sun/", "[")


def linked_members(jar: Path) -> set[str]:
    """``owner name descriptor`` for every non-JDK member (and ``owner CLASS -`` for every class)
    the launcher's constant pools refer to, as ``javap -v`` prints them."""
    listing = subprocess.run(
        ["javap", "-v", "-p", "-cp", str(jar), *launcher_classes(jar)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    found = set()
    for line in listing.splitlines():
        member = POOL_MEMBER.search(line)
        if member:
            owner_name, _, descriptor = member.group(1).partition(":")
            owner, dot, quoted = owner_name.rpartition(".")
            owner, name = owner.strip('"'), quoted.strip('"')  # javap quotes "<init>" and arrays
            if dot and not owner.startswith(OURS):
                found.add(f"{owner} {name} {descriptor}")
        klass = POOL_CLASS.search(line)
        if klass and not klass.group(1).strip('"').startswith(OURS):
            found.add(f"{klass.group(1)} CLASS -")
    return found


@pytest.mark.spark
@pytest.mark.compat
def test_every_spark_member_the_launcher_links_to_exists_on_this_spark(probe: list[str]) -> None:
    jar = launcher_jar()
    members = linked_members(jar)
    owners = {m.split()[0] for m in members}
    # The public API it is written against, and nothing of Spark's internals (the shim reflects).
    assert {
        "org/apache/spark/api/plugin/PluginContext",
        "org/apache/spark/SparkConf",
        "scala/Tuple2",
    } <= owners
    assert not {o for o in owners if o.startswith("org/apache/spark/storage/")}, sorted(owners)
    assert not [m for m in members if " killAndReplaceExecutor " in m]
    out = run_probe(probe, "links", stdin="\n".join(sorted(members)) + "\n")
    assert out[-1] == f"CHECKED {len(members)}"
    assert out[:-1] == [], f"on Spark {spark_version()}: {out[:-1]}"
    overridden = run_probe(probe, "overrides", *launcher_classes(jar))
    assert int(overridden[-1].split()[1]) >= 8, overridden  # init, shutdown, onTask*, listener hooks...
    assert overridden[:-1] == [], overridden


@pytest.mark.spark
@pytest.mark.compat
def test_the_shim_finds_every_spark_internal_on_this_spark(probe: list[str]) -> None:
    out = run_probe(probe, "internals")
    assert out == [f"VERSION {spark_version()}"], out


@pytest.mark.spark
def test_the_shim_checks_tell_a_changed_signature_from_a_matching_one(probe: list[str]) -> None:
    lines = run_probe(probe, "checks")
    cases = dict(line.split(" ", 2)[1:] for line in lines if line.startswith("CASE "))
    assert cases["exact"] == "ok"
    assert cases["inherited"] == "ok"
    assert cases["array-return"] == "ok"
    assert cases["wrong-return"] == "no public long length() on java.lang.String (it has int length())"
    assert cases["no-method"] == "no public int lengthInBytes() on java.lang.String"
    assert cases["wrong-params"] == (
        "no public char charAt(long) on java.lang.String (it has char charAt(int))"
    )
    # The exact return type, as a call links: a wider one the method could be used as is not it.
    supertype = cases["supertype-return"]
    assert supertype.startswith("no public Appendable append(String) on java.lang.StringBuilder (it has ")
    assert "StringBuilder append(String)" in supertype
    assert cases["static-expected"] == "length is an instance method"
    assert cases["instance-expected"] == "valueOf is static"
    assert cases["no-class"] == "class java.lang.NoSuchThing is not there"
    assert cases["non-public-class"] == "class java.lang.StringLatin1 is not public"
    assert "INVOKE 4" in lines
    assert "INVOKE-MISSING refused" in lines
    assert "INVOKE-THROWS StringIndexOutOfBoundsException" in lines


def test_the_python_side_reads_what_the_jvm_found_unavailable() -> None:
    settings = {
        "spark.app.id": "app-1",
        f"{JVM_UNAVAILABLE}kill-and-replace-executor": "SparkContext.killAndReplaceExecutor(String): gone",
        "arrowbeat.executor.local.dirs": "",
    }
    assert unavailable_internals(settings) == {
        "kill-and-replace-executor": "SparkContext.killAndReplaceExecutor(String): gone"
    }
    assert unavailable_internals({"spark.app.id": "app-1"}) == {}


def run_one_executor_app(scratch: Path, name: str, java_options: str = "") -> tuple[str, str, list[str]]:
    """hold_app on ``local-cluster[1,1,1024]`` (its executor a JVM of its own), held until the
    executor's agent registered; returns (driver log, executor log, its lines with the executor
    plugin's start-up line)."""
    tables, go = scratch / f"{name}-tables", scratch / f"{name}-go"
    conf = {
        "spark.arrowbeat.heartbeat.interval": "500ms",
        "spark.arrowbeat.heartbeat.timeout": "2s",
        "spark.arrowbeat.tables.path": str(tables),
        "spark.arrowbeat.tables.flushInterval": "500ms",
    }
    if java_options:
        conf["spark.driver.extraJavaOptions"] = f"-Dderby.system.home={scratch / 'derby'} {java_options}"
        conf["spark.executor.extraJavaOptions"] = java_options
    app = SubmittedApp(HOLD_APP, "local-cluster[1,1,1024]", scratch, conf=conf, args=[str(go)])
    try:
        ready = app.wait_for("APP-READY ", timeout_s=180)
        assert ready["rm_address"], app.log_tail()  # the driver plugin started its process
        assert ready["sum"] == sum(range(100_000)) and ready["executors"] == 1
        assert wait_until(lambda: ("0", "REGISTERED") in events(tables), GENEROUS_S), app.log_tail()
        app.finish_hold(go, timeout_s=180)
        app_id = rows(tables, "executor_events")[0]["app_id"]
        executor_log = (executor_dirs(app_id) / "0" / "stderr").read_text(errors="replace")
        started = [line for line in executor_log.splitlines() if EXECUTOR_LINE.search(line)]
        return app.log_text(), executor_log, started
    finally:
        app.close()


@pytest.mark.spark  # the matrix's cells check the executor side in tests/compat (one app there)
def test_the_plugin_starts_on_this_spark_with_every_internal_found(scratch: Path) -> None:
    driver_log, executor_log, started = run_one_executor_app(scratch, "launcher-compat")
    version = spark_version()
    assert f"arrowbeat driver plugin on Spark {version}: every Spark internal it uses was found" in driver_log
    assert UNAVAILABLE_WARNING not in driver_log and UNAVAILABLE_WARNING not in executor_log
    assert len(started) == 1, started
    line = EXECUTOR_LINE.search(started[0])
    assert line is not None and line["version"] == version
    assert line["source"] == "block manager" and line["host"], started[0]
    # The executor's own local dirs, as its block manager created them under Spark's local root.
    dirs = [Path(d) for d in line["dirs"].split(",") if d]
    assert dirs and all(d.name.startswith("blockmgr-") for d in dirs), started[0]
    root = Path(os.environ["SPARK_LOCAL_DIRS"]).resolve()
    assert all(d.resolve().is_relative_to(root) for d in dirs), (started[0], root)
    assert "arrowbeat agent-0 started" in executor_log


@pytest.mark.spark
def test_with_every_internal_unavailable_the_plugin_warns_once_each_and_runs_on(scratch: Path) -> None:
    switch = f"-D{TEST_SWITCH}={','.join(INTERNALS)}"
    driver_log, executor_log, started = run_one_executor_app(scratch, "launcher-no-internals", switch)

    def warned(log: str) -> list[str]:
        return [line for line in log.splitlines() if UNAVAILABLE_WARNING in line]

    # One warning per internal per JVM, naming it: the driver uses one, the executor two.
    (driver_warning,) = warned(driver_log)
    assert "kill-and-replace-executor" in driver_warning and TEST_SWITCH in driver_warning
    assert (
        "arrowbeat driver plugin on Spark" in driver_log
        and "unavailable: kill-and-replace-executor" in driver_log
    )
    executor_warnings = warned(executor_log)
    named = sorted(m[1] for w in executor_warnings if (m := WARNED_INTERNAL.search(w)))
    assert named == ["executor-host", "executor-local-dirs"], executor_warnings
    # The executor plugin ran on without them: no local dirs, a host from elsewhere, the agent
    # started (and registered: run_one_executor_app waited for it).
    line = EXECUTOR_LINE.search(started[0]) if len(started) == 1 else None
    assert line is not None and line["dirs"] == "" and line["source"] != "block manager", started
    assert "arrowbeat agent-0 started" in executor_log
