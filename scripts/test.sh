#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs what it needs, then lint, types, pytest, and the wheel's test.
# Servers the tests need (PostgreSQL, the local broker, the local v3io server) are started by the test
# fixtures on free loopback ports and stopped by PID when the session ends.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
# What CI is meant to have: a run without one of these fails here, naming it, instead of passing with the tests
# that need it skipped. A developer opts out on purpose: STREAMGROUP_OPTIONAL=postgres (comma-separated; `wheel`
# skips the wheel's test, which needs Python 3.12 and the package index or uv's cache).
missing=()
optional=",${STREAMGROUP_OPTIONAL:-},"
if ! java -version 2>&1 | grep -Eq 'version "(1[7-9]|[2-9][0-9])'; then missing+=("java: Java 17 or newer"); fi
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1; then
  missing+=("postgres: PostgreSQL's server binaries (Debian's postgresql package)")
fi
if ! .venv/bin/python -c 'from dagster_streamgroup.local.kafka_broker import kafka_libs; kafka_libs()' 2>/dev/null; then
  missing+=("kafka: Apache Kafka's jars (scripts/setup.sh fetches them with Maven)")
fi
if ! .venv/bin/python -c 'from dagster_streamgroup.local.schema_registry import registry_home, registry_java; registry_home(); registry_java()' 2>/dev/null; then
  missing+=("registry: the local Schema Registry (Apicurio Registry, fetched by scripts/setup.sh) or a Java 21+ to run it")
fi
for item in "${missing[@]}"; do
  if [[ "$optional" == *",${item%%:*},"* ]]; then
    echo "test: ${item#*: } missing; its tests are skipped (STREAMGROUP_OPTIONAL lists ${item%%:*})" >&2
  else
    echo "test: ${item#*: } missing; install it (scripts/setup.sh does, as root) or set STREAMGROUP_OPTIONAL=${item%%:*}" >&2
    failed=1
  fi
done
if [ "${failed:-0}" = 1 ]; then exit 1; fi
export PYSPARK_PYTHON="$PWD/.venv/bin/python" SPARK_LOCAL_IP=127.0.0.1 PYTHONHASHSEED=0
echo "test: ruff"
.venv/bin/ruff check dagster_streamgroup tests bench jobs sensors scripts definitions.py
.venv/bin/ruff format --check dagster_streamgroup tests bench jobs sensors scripts definitions.py
echo "test: mypy --strict"
.venv/bin/mypy
if [ $# -gt 0 ]; then
  echo "test: pytest $*"
  exec .venv/bin/pytest "$@"
fi
echo "test: pytest"
.venv/bin/pytest -m "not spark_connect and not own_process"
# The secrets search over a whole deployment, in a process of its own (a whole deployment with its own broker,
# Connect server and PostgreSQL role, about 3 minutes), and over what scripts/example.sh starts (about a minute).
echo "test: pytest, the tests that run in a process of their own"
.venv/bin/pytest -m "own_process and not spark_connect"
# PySpark allows no Spark Connect session in a process that runs a classic one, as the tests above do.
echo "test: pytest, the Spark Connect tests in a process of their own"
.venv/bin/pytest -m spark_connect
# The wheel as users get it, on a second Python (3.12) with the newest releases the dependency ranges allow: its
# contents, a runtime-only install, a create-dagster project with a stream asset and the example's definitions
# materialized against the local broker, the unit tests (about 3 minutes; bounded). Other Pythons and the ranges'
# floors: `bash scripts/test_wheel.sh --all` (opt-in).
if [[ "$optional" == *",wheel,"* ]]; then
  echo "test: the wheel's test skipped (STREAMGROUP_OPTIONAL lists wheel)" >&2
  exit 0
fi
echo "test: the wheel (scripts/test_wheel.sh)"
exec bash scripts/test_wheel.sh
