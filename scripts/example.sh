#!/usr/bin/env bash
# The example end to end on a fresh machine: set-up, the local Kafka-compatible broker, a producer of sample
# clickstream events, and `dagster dev` on 127.0.0.1 with three member sensors running. Ctrl-C stops
# everything this script started, by PID. The broker keeps its data in memory, so every start begins with a
# fresh Dagster instance and group state (./dagster_home).
#   PORT=3000 RATE=300 SPARK=connect bash scripts/example.sh
# SPARK=connect (default) also starts the local Spark Connect server, which runs attach to instead of each
# starting a JVM; SPARK=local gives every run its own local[2] session.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh

PORT=${PORT:-3000}
RATE=${RATE:-300}
SPARK=${SPARK:-connect}
case "$SPARK" in connect|local) ;; *) echo "example: SPARK must be connect or local, got '$SPARK'" >&2; exit 2 ;; esac
KAFKA_PORT=${KAFKA_PORT:-$(.venv/bin/python -c 'from dagster_streamgroup.local.kafka_broker import free_port; print(free_port())')}
export DAGSTER_HOME="$PWD/dagster_home"
export CLICKSTREAM_BOOTSTRAP="127.0.0.1:$KAFKA_PORT"
export CLICKSTREAM_OUTPUT="${CLICKSTREAM_OUTPUT:-$PWD/output/clickstream}"
export PYSPARK_PYTHON="$PWD/.venv/bin/python" SPARK_LOCAL_IP=127.0.0.1

rm -rf "$DAGSTER_HOME" "$CLICKSTREAM_OUTPUT"
mkdir -p "$DAGSTER_HOME"
cp dagster.yaml "$DAGSTER_HOME/dagster.yaml"

set -m  # every background job gets its own process group, with default signal handlers (dagster dev needs them)
pids=()
stop_all() {
  trap - INT TERM EXIT
  echo "example: stopping (${pids[*]:-nothing})"
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do  # the reverse of the start order: dagster dev first, broker last
    pid=${pids[i]}
    kill -INT -- "-$pid" 2>/dev/null || true
    for _ in $(seq 75); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL -- "-$pid" 2>/dev/null || true
  done
}
trap stop_all INT TERM EXIT

.venv/bin/streamgroup local kafka --port "$KAFKA_PORT" &
pids+=($!)
.venv/bin/python - <<PY
from dagster_streamgroup.local.kafka_broker import wait_until_answering
wait_until_answering("$CLICKSTREAM_BOOTSTRAP", timeout_s=30)
PY
.venv/bin/python -m jobs.clickstream_events --bootstrap "$CLICKSTREAM_BOOTSTRAP" --rate "$RATE" &
pids+=($!)
if [ "$SPARK" = connect ]; then
  SPARK_PORT=$(.venv/bin/python -c 'from dagster_streamgroup.local.kafka_broker import free_port; print(free_port())')
  .venv/bin/streamgroup local spark-connect --port "$SPARK_PORT" &
  pids+=($!)
  export CLICKSTREAM_SPARK_REMOTE="sc://127.0.0.1:$SPARK_PORT"
  .venv/bin/python - <<PY
import time
from dagster_streamgroup.local.spark_connect import port_answers
deadline = time.monotonic() + 180
while not port_answers($SPARK_PORT):
    if time.monotonic() > deadline:
        raise SystemExit("example: the Spark Connect server did not answer within 180 s")
    time.sleep(0.5)
PY
fi
.venv/bin/dagster dev -w workspace.yaml -h 127.0.0.1 -p "$PORT" &
pids+=($!)
echo "example: Dagster UI on http://127.0.0.1:$PORT (broker $CLICKSTREAM_BOOTSTRAP); Ctrl-C stops everything"
wait -n "${pids[@]}" || true
