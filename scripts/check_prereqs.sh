#!/usr/bin/env bash
# Stops set-up with one line naming what is missing and how to get it.
#   check_prereqs.sh python   what `make unit` / `make lint` need: a fitting Python with venv
#   check_prereqs.sh jvm      what the Spark side needs on top: a JDK (java + javac) and Maven
#   check_prereqs.sh          both
set -u
fail() { echo "arrowbeat set-up: $1" >&2; exit 1; }
part="${1:-all}"
case "$part" in python|jvm|all) ;; *) fail "unknown part '$part': expected python, jvm or all";; esac

if [ "$part" != jvm ]; then
  PY="${PYTHON:-python3}"
  command -v "$PY" >/dev/null 2>&1 || fail "no '$PY' on PATH: install Python 3.11 to 3.13 (e.g. apt-get install python3.11 python3.11-venv) or set PYTHON=/path/to/python3.11"
  "$PY" -c 'import sys; sys.exit(0 if (3, 11) <= sys.version_info[:2] <= (3, 13) else 1)' \
    || fail "$("$PY" -V 2>&1) does not fit: arrowbeat needs Python 3.11 to 3.13 (set PYTHON=/path/to/python3.11)"
  "$PY" -c 'import venv, ensurepip' 2>/dev/null || fail "Python's venv/ensurepip module is missing: apt-get install python3-venv"
fi

if [ "$part" != python ]; then
  command -v java >/dev/null 2>&1 || fail "no 'java' on PATH: install a JDK 17 or 21 (e.g. apt-get install openjdk-17-jdk-headless)"
  command -v javac >/dev/null 2>&1 || fail "no 'javac' on PATH (a JRE is not enough): install a JDK 17 or 21 (e.g. apt-get install openjdk-17-jdk-headless)"
  jv=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1)
  case "$jv" in 17|21) ;; *) fail "Java $jv does not fit: Spark 4.0 needs Java 17 or 21 (set JAVA_HOME / PATH to one)";; esac
  command -v mvn >/dev/null 2>&1 || fail "no 'mvn' on PATH: install Maven 3.6+ (e.g. apt-get install maven); it fetches the Delta jars and the launcher's Spark API jars"
fi
exit 0
