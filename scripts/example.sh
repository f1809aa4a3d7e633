#!/usr/bin/env bash
# The example end to end on a fresh machine: set-up, a local Apache Kafka broker (KRaft, one node, from the
# jars the set-up fetched), a producer of sample clickstream events, and `dg dev` on 127.0.0.1 with three
# member sensors running; once the UI answers it prints where to look. Ctrl-C stops everything this script started, by PID. The broker keeps its data in
# ./dagster_home/kafka-data, and like the Dagster instance and the group state it starts empty each time.
#   PORT=3000 RATE=300 SPARK=connect STREAM=kafka bash scripts/example.sh
# SPARK=connect (default) also starts the local Spark Connect server, which runs attach to instead of each
# starting a JVM; SPARK=local gives every run its own local[2] session.
# STREAM=v3io runs the same example on a v3io stream of 8 shards (CLICKSTREAM_PARTITIONS) instead: the local
# v3io-compatible server (data in ./dagster_home/v3io-data, so it too starts empty) requires an access key
# generated for this start, handed only to the processes that use it, in V3IO_ACCESS_KEY; the group state is
# a KV item next to the stream. The key is also left in ./dagster_home/v3io-access-key (mode 600) for the CLI:
#   V3IO_ACCESS_KEY=$(cat dagster_home/v3io-access-key) CLICKSTREAM_STREAM=v3io CLICKSTREAM_V3IO_API=... \
#     .venv/bin/streamgroup status --group clickstream
# FORMAT=avro writes the events as Avro in the Confluent wire format: the local Schema Registry (Apicurio
# Registry, Confluent's API, `streamgroup local registry`) starts beside the broker, the producer registers the
# schema through confluent-kafka's AvroSerializer, and the group hands the function typed columns (docs/formats.md).
# DAGSTER_STORAGE=postgres keeps the Dagster instance's runs, events and schedules in a temporary PostgreSQL
# server on 127.0.0.1 (deleted on stop) instead of SQLite files in ./dagster_home: ./dagster_home/dagster.yaml
# is ./dagster.yaml plus a storage block whose password is read from DAGSTER_PG_PASSWORD, generated for this
# start and handed to the processes in the environment only.
# Each secret reaches only the processes that use it, in their environment (never a command line): the instance
# database's password the PostgreSQL helper and `dg dev`; the v3io key the v3io server, the producer and
# `dg dev`. The broker and the Spark Connect server get neither.
# EXAMPLE_HOME=DIR keeps the instance and the servers' data in DIR instead of ./dagster_home (emptied too).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
DAGSTER_STORAGE=${DAGSTER_STORAGE:-sqlite}
case "$DAGSTER_STORAGE" in
  sqlite|postgres) ;;
  *) echo "example: DAGSTER_STORAGE must be sqlite or postgres (default sqlite), got '$DAGSTER_STORAGE'" >&2; exit 2 ;;
esac
FORMAT=${FORMAT:-json}
case "$FORMAT" in json|avro) ;; *) echo "example: FORMAT must be json or avro, got '$FORMAT'" >&2; exit 2 ;; esac
if [ "$FORMAT" = avro ] && [ "${STREAM:-kafka}" != kafka ]; then
  echo "example: FORMAT=avro needs STREAM=kafka" >&2
  exit 2
fi
bash scripts/setup.sh

PORT=${PORT:-3000}
RATE=${RATE:-300}
SPARK=${SPARK:-connect}
case "$SPARK" in connect|local) ;; *) echo "example: SPARK must be connect or local, got '$SPARK'" >&2; exit 2 ;; esac
STREAM=${STREAM:-kafka}
case "$STREAM" in kafka|v3io) ;; *) echo "example: STREAM must be kafka or v3io, got '$STREAM'" >&2; exit 2 ;; esac
KAFKA_PORT=${KAFKA_PORT:-$(.venv/bin/python -c 'from dagster_streamgroup.local.kafka_broker import free_port; print(free_port())')}
export DAGSTER_HOME="${EXAMPLE_HOME:-$PWD/dagster_home}"
unset DAGSTER_PG_PASSWORD V3IO_ACCESS_KEY  # generated below, for the processes that use them only
pg_password=""
v3io_key=""
start_with_secrets() {  # COMMAND...: start it in the background ($! is its PID) with this start's secrets
  {
    if [ -n "$pg_password" ]; then export DAGSTER_PG_PASSWORD="$pg_password"; fi
    if [ -n "$v3io_key" ]; then export V3IO_ACCESS_KEY="$v3io_key"; fi
    exec "$@"
  } &
}
export CLICKSTREAM_STREAM="$STREAM"
CLICKSTREAM_GROUP_NAME=${CLICKSTREAM_GROUP:-clickstream}
export CLICKSTREAM_BOOTSTRAP="127.0.0.1:$KAFKA_PORT"
export CLICKSTREAM_OUTPUT="${CLICKSTREAM_OUTPUT:-$PWD/output/clickstream}"
# The clicks in a Delta table (output/clickstream/clicks) and page views per minute beside it, kept by Dagster's
# automation as ranges land; CLICKSTREAM_SINK=parquet: per-range partials, one Parquet folder per range.
export CLICKSTREAM_SINK="${CLICKSTREAM_SINK:-delta}"
export PYSPARK_PYTHON="$PWD/.venv/bin/python" SPARK_LOCAL_IP=127.0.0.1

rm -rf "$DAGSTER_HOME" "$CLICKSTREAM_OUTPUT"
mkdir -p "$DAGSTER_HOME"
if [ "$DAGSTER_STORAGE" = sqlite ]; then
  cp dagster.yaml "$DAGSTER_HOME/dagster.yaml"
fi

set -m  # every background job gets its own process group, with default signal handlers (dg dev needs them)
pids=()
stop_all() {
  trap - INT TERM EXIT
  echo "example: stopping (${pids[*]:-nothing})"
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do  # the reverse of the start order: dg dev first, broker last
    pid=${pids[i]}
    kill -INT -- "-$pid" 2>/dev/null || true
    for _ in $(seq 75); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL -- "-$pid" 2>/dev/null || true
  done
}
trap stop_all INT TERM EXIT

wait_for_port() {  # PORT SECONDS WHAT: until a server we started answers on 127.0.0.1:PORT
  .venv/bin/python - "$1" "$2" "$3" <<'PY'
import sys
import time
from dagster_streamgroup.local.spark_connect import port_answers
port, limit, what = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
deadline = time.monotonic() + limit
while not port_answers(port):
    if time.monotonic() > deadline:
        raise SystemExit(f"example: {what} did not answer within {limit:g} s")
    time.sleep(0.2)
PY
}

if [ "$DAGSTER_STORAGE" = postgres ]; then  # started first, stopped last; it writes $DAGSTER_HOME/dagster.yaml
  pg_password=$(.venv/bin/python -c 'import secrets; print(secrets.token_urlsafe(24))')
  DAGSTER_PG_PASSWORD="$pg_password" .venv/bin/python -m dagster_streamgroup.local.dagster_storage \
    --home "$DAGSTER_HOME" --base dagster.yaml &
  storage_pid=$!
  pids+=("$storage_pid")
fi

if [ "$STREAM" = kafka ]; then
  rm -rf "$DAGSTER_HOME/kafka-data"
  .venv/bin/streamgroup local kafka --port "$KAFKA_PORT" --data "$DAGSTER_HOME/kafka-data" &
  pids+=($!)
  .venv/bin/python - <<PY
from dagster_streamgroup.local.kafka_broker import wait_until_answering
wait_until_answering("$CLICKSTREAM_BOOTSTRAP", timeout_s=90)
PY
  producer_format=()
  if [ "$FORMAT" = avro ]; then
    REGISTRY_PORT=${REGISTRY_PORT:-$(.venv/bin/python -c 'from dagster_streamgroup.local.kafka_broker import free_port; print(free_port())')}
    .venv/bin/streamgroup local registry --port "$REGISTRY_PORT" &
    pids+=($!)
    export CLICKSTREAM_FORMAT=avro CLICKSTREAM_SCHEMA_REGISTRY_URL="http://127.0.0.1:$REGISTRY_PORT/apis/ccompat/v7"
    .venv/bin/python - <<PY
import time
from dagster_streamgroup.local.schema_registry import answers
deadline = time.monotonic() + 120
while not answers("$CLICKSTREAM_SCHEMA_REGISTRY_URL"):
    if time.monotonic() > deadline:
        raise SystemExit("example: the Schema Registry did not answer within 120 s")
    time.sleep(0.3)
PY
    producer_format=(--format avro --registry "$CLICKSTREAM_SCHEMA_REGISTRY_URL")
  fi
  .venv/bin/python -m jobs.clickstream_events --bootstrap "$CLICKSTREAM_BOOTSTRAP" --rate "$RATE" "${producer_format[@]}" &
  pids+=($!)
else
  V3IO_PORT=${V3IO_PORT:-$(.venv/bin/python -c 'from dagster_streamgroup.local.kafka_broker import free_port; print(free_port())')}
  export CLICKSTREAM_V3IO_API="http://127.0.0.1:$V3IO_PORT"
  export CLICKSTREAM_V3IO_CONTAINER="${CLICKSTREAM_V3IO_CONTAINER:-bigdata}"
  export CLICKSTREAM_V3IO_STREAM_PATH="${CLICKSTREAM_V3IO_STREAM_PATH:-clicks}"
  export CLICKSTREAM_PARTITIONS="${CLICKSTREAM_PARTITIONS:-8}"
  v3io_key=$(.venv/bin/python -c 'import secrets; print(secrets.token_hex(16))')
  (umask 077 && printf '%s\n' "$v3io_key" >"$DAGSTER_HOME/v3io-access-key")
  STREAMGROUP_V3IO_ACCESS_KEY="$v3io_key" .venv/bin/streamgroup local v3io --host 127.0.0.1 \
    --port "$V3IO_PORT" --data "$DAGSTER_HOME/v3io-data" &
  pids+=($!)
  wait_for_port "$V3IO_PORT" 30 "the v3io server"
  V3IO_ACCESS_KEY="$v3io_key" .venv/bin/python - <<PY
from jobs.clickstream_events import ensure_v3io_stream, v3io_client
client = v3io_client("$CLICKSTREAM_V3IO_API")  # the key comes from V3IO_ACCESS_KEY
path = "$CLICKSTREAM_V3IO_STREAM_PATH"
shards = ensure_v3io_stream(client, "$CLICKSTREAM_V3IO_CONTAINER", path, $CLICKSTREAM_PARTITIONS)
print(f"example: v3io stream $CLICKSTREAM_V3IO_CONTAINER/{path} with {shards} shards")
PY
  V3IO_ACCESS_KEY="$v3io_key" .venv/bin/python -m jobs.clickstream_events --stream v3io --v3io-api "$CLICKSTREAM_V3IO_API" \
    --container "$CLICKSTREAM_V3IO_CONTAINER" --stream-path "$CLICKSTREAM_V3IO_STREAM_PATH" \
    --partitions "$CLICKSTREAM_PARTITIONS" --rate "$RATE" &
  pids+=($!)
fi
if [ "$SPARK" = connect ]; then
  SPARK_PORT=$(.venv/bin/python -c 'from dagster_streamgroup.local.kafka_broker import free_port; print(free_port())')
  .venv/bin/streamgroup local spark-connect --port "$SPARK_PORT" &
  pids+=($!)
  export CLICKSTREAM_SPARK_REMOTE="sc://127.0.0.1:$SPARK_PORT"
  wait_for_port "$SPARK_PORT" 180 "the Spark Connect server"
fi
if [ "$DAGSTER_STORAGE" = postgres ]; then
  for _ in $(seq 300); do
    [ -f "$DAGSTER_HOME/dagster.yaml" ] && break
    kill -0 "$storage_pid" 2>/dev/null || { echo "example: the instance's PostgreSQL server exited" >&2; exit 1; }
    sleep 0.2
  done
  [ -f "$DAGSTER_HOME/dagster.yaml" ] || { echo "example: the instance's PostgreSQL not ready within 60 s" >&2; exit 1; }
fi
echo "example: instance settings (one run per shard at a time) from dagster.yaml, copied to $DAGSTER_HOME" \
  "(storage: $DAGSTER_STORAGE)"
# `dg dev`, as Dagster 1.13 projects start (the [local] extra brings dagster-dg-cli), over this repository's
# workspace.yaml (its paths are relative to that file). It starts in $DAGSTER_HOME: Dagster warns when the
# folder it starts in holds a dagster.yaml that is not the instance's, and ./dagster.yaml is only the template
# copied above. The group state and the outputs do not depend on the working directory (DAGSTER_HOME and
# CLICKSTREAM_OUTPUT are absolute).
root=$PWD
cd "$DAGSTER_HOME"
start_with_secrets "$root/.venv/bin/dg" dev -w "$root/workspace.yaml" -h 127.0.0.1 -p "$PORT"
pids+=($!)
cd "$root"
case "$CLICKSTREAM_SINK" in  # the stream asset jobs/clickstream.py defines for the sink
  delta) asset=clicks ;;
  *) asset=page_views_per_minute ;;
esac
wait_for_port "$PORT" 300 "the Dagster UI"
if [ "$STREAM" = kafka ]; then
  status_env="DAGSTER_HOME=$DAGSTER_HOME CLICKSTREAM_BOOTSTRAP=$CLICKSTREAM_BOOTSTRAP"
else
  status_env="DAGSTER_HOME=$DAGSTER_HOME V3IO_ACCESS_KEY=\$(cat $DAGSTER_HOME/v3io-access-key) CLICKSTREAM_STREAM=v3io"
  status_env+=" CLICKSTREAM_V3IO_API=$CLICKSTREAM_V3IO_API"
fi
cat <<WHERE
example: the Dagster UI is up: http://127.0.0.1:$PORT
example:   the stream asset, one partition per shard, its lag and ranges: http://127.0.0.1:$PORT/assets/$asset
example:   the member runs: http://127.0.0.1:$PORT/runs
example:   the group from a shell: $status_env .venv/bin/streamgroup status --group $CLICKSTREAM_GROUP_NAME
example: Ctrl-C stops everything
WHERE
wait -n "${pids[@]}" || true
