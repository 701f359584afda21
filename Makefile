# arrowbeat: two commands do all set-up. `make demo` runs the demo application, `make test` the checks.
# Everything is cached under .venv/ and .cache/; rerunning is cheap and safe.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PRIMARY_CELL := spark-4.2
CACHE := .cache
JARS := $(CACHE)/jars
# Delta's jars for every supported Spark minor (one artifact per minor; spark_plugin/compat/versions.py).
DELTA_JARS := $(JARS)/.delta-jars
LAUNCHER_JAR := $(CACHE)/launcher/arrowbeat-launcher.jar
LAUNCHER_SRC := $(shell find launcher/src/main -name '*.java' 2>/dev/null)
# The launcher's unit tests' runner (make jvm-test): JUnit's console launcher, one jar.
JUNIT_VERSION := 1.14.1
JUNIT_JAR := $(CACHE)/launcher/junit/junit-platform-console-standalone-$(JUNIT_VERSION).jar
LAUNCHER_TESTS := $(CACHE)/launcher/test-classes
MVN_DEP := org.apache.maven.plugins:maven-dependency-plugin:3.8.1
export SPARK_LOCAL_IP ?= 127.0.0.1
export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: setup setup-python setup-jvm prereqs prereqs-python prereqs-jvm demo test lint typecheck unit \
	proto bench bench-readme clean wheel matrix wheelhouse cell jvm-test docs
# Set-up in two parts: Python (venv + pip: all `unit`, `lint` and `typecheck` need) and the JVM
# side on top (the Delta jars via Maven, the launcher via javac) for Spark, `test`, `demo`, `bench`.
setup: setup-python setup-jvm
setup-python: prereqs-python $(VENV)/.installed
setup-jvm: prereqs-jvm $(DELTA_JARS) $(LAUNCHER_JAR) $(JUNIT_JAR)

prereqs: prereqs-python prereqs-jvm
prereqs-python:
	@PYTHON=$(PYTHON) bash scripts/check_prereqs.sh python
prereqs-jvm:
	@bash scripts/check_prereqs.sh jvm

# The primary cell of the version matrix (scripts/matrix.py): the exact set in its lock file.
# arrowbeat itself in editable mode, with the wheel's start-up line (arrowbeat.pth: the build
# backend's build_editable adds it), so a change of either reinstalls it; rerunning is safe.
$(VENV)/.installed: pyproject.toml locks/$(PRIMARY_CELL).txt scripts/matrix.py build_backend/arrowbeat_build.py arrowbeat.pth
	$(PYTHON) -m scripts.matrix venv $(PRIMARY_CELL)
	@touch $@

$(DELTA_JARS): spark_plugin/compat/versions.py
	@mkdir -p $(JARS)
	for artifact in $$($(PYTHON) -m scripts.matrix delta-jars); do \
	  mvn -q -B $(MVN_DEP):copy -Dartifact=$$artifact -DoutputDirectory=$(JARS) || exit 1; done
	@touch $@

# The launcher is compiled against the oldest supported Spark's API jars (Maven coordinates in
# build_backend/launcher_classpath.txt), never against the venv's pyspark: one jar runs on every
# supported Spark. The wheel build (build_backend/) compiles from the same list.
LAUNCHER_CP := $(CACHE)/launcher/classpath
$(LAUNCHER_JAR): $(LAUNCHER_SRC) build_backend/launcher_classpath.txt build_backend/launcher_jar.py
	$(PYTHON) build_backend/launcher_jar.py --classpath-dir $(LAUNCHER_CP) --jar $@

# The launcher's JUnit tests (launcher/src/test: its start, supervision, restart-budget, command
# and launch decisions on a fake clock, without Spark or a process), compiled against the launcher
# jar and run by JUnit's console launcher: one jar, fetched by Maven as the API jars are.
$(JUNIT_JAR):
	@mkdir -p $(dir $@)
	mvn -q -B $(MVN_DEP):copy -Dartifact=org.junit.platform:junit-platform-console-standalone:$(JUNIT_VERSION) \
	  -DoutputDirectory=$(dir $@)

jvm-test: prereqs-jvm $(LAUNCHER_JAR) $(JUNIT_JAR)
	@rm -rf $(LAUNCHER_TESTS) && mkdir -p $(LAUNCHER_TESTS)
	javac -nowarn --release 17 -d $(LAUNCHER_TESTS) -cp '$(LAUNCHER_JAR):$(LAUNCHER_CP)/*:$(JUNIT_JAR)' \
	  $$(find launcher/src/test -name '*.java')
	java -Dslf4j.internal.verbosity=ERROR -cp '$(LAUNCHER_TESTS):$(LAUNCHER_JAR):$(LAUNCHER_CP)/*:$(JUNIT_JAR)' \
	  org.junit.platform.console.ConsoleLauncher execute --disable-banner --details=summary \
	  --fail-if-no-tests --scan-class-path $(LAUNCHER_TESTS)

DEMO_WORK := $(abspath $(CACHE))/demo
# local-cluster Workers keep executor dirs in $SPARK_HOME/work (inside the pyspark package; they
# ignore SPARK_WORKER_DIR): the demo removes the ones its applications made.
SPARK_PACKAGE_WORK = "$$($(PY) -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "work"))')"
demo: setup
	@mkdir -p $(DEMO_WORK) && touch $(DEMO_WORK)/.started
	$(VENV)/bin/spark-submit $$($(PY) -m spark_plugin conf) \
	  --master 'local-cluster[2,1,1024]' --conf spark.executor.memory=512m --conf spark.driver.memory=1g \
	  --conf spark.ui.enabled=false --conf spark.log.level=WARN --conf spark.sql.warehouse.dir=$(DEMO_WORK)/warehouse \
	  --conf spark.driver.extraJavaOptions=-Dderby.system.home=$(DEMO_WORK) \
	  jobs/demo.py
	@# The liveness report of the demo application (its frozen executor's timeout and re-registration).
	$(PY) -m spark_plugin.tools.cli report --tables $(DEMO_WORK)/warehouse/arrowbeat --app latest -o $(DEMO_WORK)/report.html
	$(VENV)/bin/spark-submit $$($(PY) -m spark_plugin conf) \
	  --master 'local-cluster[2,1,1024]' --conf spark.executor.memory=512m --conf spark.driver.memory=1g \
	  --conf spark.ui.enabled=false --conf spark.log.level=WARN --conf spark.sql.warehouse.dir=$(DEMO_WORK)/warehouse \
	  --conf spark.driver.extraJavaOptions=-Dderby.system.home=$(DEMO_WORK) \
	  jobs/arrow_pipeline.py --rows 2000000
	@find $(SPARK_PACKAGE_WORK) -mindepth 1 -maxdepth 1 -name 'app-*' -newer $(DEMO_WORK)/.started \
	  -exec rm -rf {} + 2>/dev/null || true

lint: setup-python
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

typecheck: setup-python
	$(VENV)/bin/mypy

unit: setup-python
	$(PY) -m pytest -q -m 'not spark' tests

# The whole suite on the primary cell and the compatibility subset on every other cell (the
# launcher's JUnit tests first, a few seconds; then three lanes side by side: two Spark shards, and
# the JVM-less tests then a third Spark shard, each lane ending with its share of the matrix's
# cells; then the chaos soak alone: scripts/run_tests.py).
test: setup lint jvm-test docs $(CACHE)/.chromium wheelhouse
	$(PY) -m scripts.run_tests --matrix

# Every cell's pyspark as a wheel in .cache/wheelhouse/, each fetched and built once (PyPI has only
# a 455 MB sdist, and pip neither caches that download nor reuses its built wheel): the cells' venvs,
# the installed wheel's venv and the wheel test's resolutions beside every supported pyspark take it
# from there (scripts/matrix.py WHEELHOUSE). Present: nothing to do.
wheelhouse:
	$(PYTHON) -m scripts.matrix wheelhouse

# The version matrix's other cells (one venv each under .cache/venvs/, from locks/<cell>.txt), each
# running the tests marked `compat`, MATRIX_JOBS cells at a time. `make cell CELL=spark-4.3` runs one.
matrix: setup-jvm
	$(PYTHON) -m scripts.matrix run-all --jobs $(MATRIX_JOBS)

MATRIX_JOBS ?= 3
CELL ?= spark-4.3
cell: setup-jvm
	$(PYTHON) -m scripts.matrix run $(CELL)

# The documentation site (mkdocs.yml, docs/) into .cache/site/: --strict, so any warning fails it, a
# link to a missing page or anchor included; the configuration, tables, event-kind and metrics
# references are generated from the code as it builds (scripts/mkdocs_hooks.py). MkDocs and the
# Material theme come with the primary venv (the docs extra, pinned in its lock). The variable hides
# Material's end-of-life banner (developer/docs.md says what it means).
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet
	@echo "docs: built .cache/site/ (open .cache/site/index.html)"

# The live page's browser test needs a headless Chromium (Debian's package; root or sudo -n).
$(CACHE)/.chromium:
	@mkdir -p $(CACHE)
	bash scripts/install_chromium.sh
	@touch $@

# `make wheel`: dist/arrowbeat-*.whl, the launcher jar inside (build_backend/ compiles it with javac
# against the Spark API jars Maven fetches; needs a JDK 17+ and Maven). `pip install` it anywhere.
wheel: prereqs-jvm $(VENV)/.installed $(LAUNCHER_JAR)
	rm -rf build  # setuptools reuses build/lib: a module deleted since must not ship
	ARROWBEAT_LAUNCHER_CLASSPATH=$(abspath $(LAUNCHER_CP)) $(PY) -m pip wheel --no-deps -w dist .

proto: $(VENV)/.installed
	$(PY) -m scripts.gen_protos

# `make bench` runs every benchmark (`make bench BENCH="shuffle_transport heartbeat_scale"` some),
# saves each one's output as .cache/bench/<name>.txt (only when it succeeds) and rewrites the
# site's benchmark table (docs/developer/benchmarks.md) from those lines. They take long: minutes each, the
# soaks SOAK_MINUTES each (default 10; the streaming soak's long form is --shuffles 10000).
BENCHES := detection_latency soak_monitoring heartbeat_scale shuffle_transport shuffle_vs_spark shuffle_matrix e2e_pandas stuck_tasks cluster_faults streaming_soak job_recovery
BENCH ?= $(BENCHES)
SOAK_MINUTES ?= 10
BENCH_DIR := $(CACHE)/bench
bench: setup $(VENV)/.bench-extra
	@mkdir -p $(BENCH_DIR)
	@set -o pipefail; for name in $(BENCH); do \
	  args=; case $$name in soak_monitoring|streaming_soak) args="--minutes $(SOAK_MINUTES)";; e2e_pandas) args=--floors;; esac; \
	  echo "== python -m benchmarks.$$name $$args"; \
	  $(PY) -m benchmarks.$$name $$args | tee $(BENCH_DIR)/$$name.txt.part \
	    && mv $(BENCH_DIR)/$$name.txt.part $(BENCH_DIR)/$$name.txt \
	    || { echo "benchmarks/$$name.py failed; its last saved figures stay" >&2; exit 1; }; \
	done
	@$(MAKE) --no-print-directory bench-readme

# The benchmarks' optional peer (Dask's P2P shuffle, in shuffle_matrix): only `make bench` needs it.
$(VENV)/.bench-extra: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[dev,bench]'
	@touch $@

bench-readme: $(VENV)/.installed
	$(PY) -m scripts.bench_results --write docs/developer/benchmarks.md

clean:
	rm -rf $(CACHE)/launcher build *.egg-info
