# arrowbeat: two commands do all set-up. `make demo` runs the demo application, `make test` the checks.
# Everything is cached under .venv/ and .cache/; rerunning is cheap and safe.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
CACHE := .cache
DELTA_VERSION := 4.0.1
JARS := $(CACHE)/jars
DELTA_JARS := $(JARS)/delta-spark_2.13-$(DELTA_VERSION).jar $(JARS)/delta-storage-$(DELTA_VERSION).jar
LAUNCHER_JAR := $(CACHE)/launcher/arrowbeat-launcher.jar
LAUNCHER_SRC := $(shell find launcher/src -name '*.java' 2>/dev/null)
MVN_DEP := org.apache.maven.plugins:maven-dependency-plugin:3.8.1
export SPARK_LOCAL_IP ?= 127.0.0.1
export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: setup demo test lint typecheck unit proto bench clean prereqs
setup: prereqs $(VENV)/.installed $(DELTA_JARS) $(LAUNCHER_JAR)

prereqs:
	@PYTHON=$(PYTHON) bash scripts/check_prereqs.sh

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@touch $@

$(JARS)/%-$(DELTA_VERSION).jar:
	@mkdir -p $(JARS)
	mvn -q -B $(MVN_DEP):copy -Dartifact=io.delta:$*:$(DELTA_VERSION) -DoutputDirectory=$(JARS)

# The launcher is compiled from source against the Spark jars that the pyspark wheel ships.
$(LAUNCHER_JAR): $(LAUNCHER_SRC) $(VENV)/.installed
	@rm -rf $(CACHE)/launcher/classes && mkdir -p $(CACHE)/launcher/classes
	javac -nowarn --release 17 -d $(CACHE)/launcher/classes \
	  -cp "$$($(PY) -c 'import pyspark, os; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')/*" \
	  $(LAUNCHER_SRC)
	jar --create --file $@ -C $(CACHE)/launcher/classes .

DEMO_WORK := $(abspath $(CACHE))/demo
demo: setup
	@mkdir -p $(DEMO_WORK)
	SPARK_WORKER_DIR=$(DEMO_WORK)/work $(VENV)/bin/spark-submit $$($(PY) -m spark_plugin conf) \
	  --master 'local-cluster[2,1,1024]' --conf spark.executor.memory=512m --conf spark.driver.memory=1g \
	  --conf spark.ui.enabled=false --conf spark.log.level=WARN --conf spark.sql.warehouse.dir=$(DEMO_WORK)/warehouse \
	  --conf spark.driver.extraJavaOptions=-Dderby.system.home=$(DEMO_WORK) \
	  jobs/demo.py
	SPARK_WORKER_DIR=$(DEMO_WORK)/work $(VENV)/bin/spark-submit $$($(PY) -m spark_plugin conf) \
	  --master 'local-cluster[2,1,1024]' --conf spark.executor.memory=512m --conf spark.driver.memory=1g \
	  --conf spark.ui.enabled=false --conf spark.log.level=WARN --conf spark.sql.warehouse.dir=$(DEMO_WORK)/warehouse \
	  --conf spark.driver.extraJavaOptions=-Dderby.system.home=$(DEMO_WORK) \
	  jobs/arrow_pipeline.py --rows 2000000

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

unit: setup
	$(PY) -m pytest -q -m 'not spark' tests

test: lint
	$(PY) -m pytest -q -rs tests

proto: $(VENV)/.installed
	$(PY) -m scripts.gen_protos

clean:
	rm -rf $(CACHE)/launcher build *.egg-info
