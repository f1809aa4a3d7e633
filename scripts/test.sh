#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs what it needs, then lint, types, and pytest.
# Servers the tests need (PostgreSQL, the local broker, the local v3io server) are started by the test
# fixtures on free loopback ports and stopped by PID when the session ends.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
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
.venv/bin/pytest -m "not spark_connect"
# PySpark allows no Spark Connect session in a process that runs a classic one, as the tests above do.
echo "test: pytest, the Spark Connect tests in a process of their own"
exec .venv/bin/pytest -m spark_connect
