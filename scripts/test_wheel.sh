#!/usr/bin/env bash
# The wheel as users get it (tests/packaging/wheel.py): built and checked, installed with its runtime dependencies
# only into a fresh virtualenv, a new project from `create-dagster project` with a stream asset, the example's
# definitions, both materialized against the local broker, and the unit tests against the installed package.
#   bash scripts/test_wheel.sh            what CI runs: Python 3.12, the newest releases the ranges allow
#   bash scripts/test_wheel.sh --all      opt-in: every supported Python (3.11-3.14) the machine has, each with
#                                         the highest and the lowest (uv's lowest-direct) releases the ranges allow;
#                                         a Python it lacks (3.14 here) is named and only resolved for
#   bash scripts/test_wheel.sh --python 3.13 --resolution lowest-direct    one combination
#   bash scripts/test_wheel.sh --dagster 1.13.29 --no-unit    a Dagster release the patches were not verified on
# Bounded by WHEEL_TIMEOUT_S (default 1800 s for one combination, 3600 s for --all). Needs what the project's
# set-up installs (scripts/setup.sh: .venv, uv, Kafka's jars, Java) and the package index (or uv's cache).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
args=("$@")
timeout_s=${WHEEL_TIMEOUT_S:-1800}
if [ "${1:-}" = "--all" ]; then
  args=(--python 3.11,3.12,3.13,3.14 --resolution highest,lowest-direct --skip-missing "${@:2}")
  timeout_s=${WHEEL_TIMEOUT_S:-3600}
fi
exec timeout --signal=INT --kill-after=60 "$timeout_s" .venv/bin/python -m tests.packaging.wheel "${args[@]}"
