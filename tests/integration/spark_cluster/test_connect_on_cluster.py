"""The local Spark Connect server on the standalone cluster: ``streamgroup local spark-connect --master
spark://...`` starts a server whose application runs its executors on the cluster's workers, and a client with
``StreamSparkResource(remote="sc://...")`` reads Kafka ranges through it. Every partition is read in an executor of
the cluster, neither in the client nor in the server's driver, and the rows are those the project's Kafka reader
returns for the same planned partitions, in the same order.

A classic session and a Connect one cannot share a process, so this runs in the Spark Connect pytest of
scripts/test.sh (marker ``spark_connect``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from dagster_streamgroup.dagster.spark_read import read_kafka_range
from dagster_streamgroup.dagster.spark_session import StreamSparkResource
from dagster_streamgroup.local import procfs
from dagster_streamgroup.local.kafka_data import produce_records, produce_sample
from dagster_streamgroup.local.spark_cluster import SparkCluster
from dagster_streamgroup.local.spark_connect import free_port, stop_process_tree
from dagster_streamgroup.spark.kafka_source import read_kafka_ranges
from dagster_streamgroup.spark.ranges import ShardRange, plan_partitions
from dagster_streamgroup.streams.kafka import KAFKA_ARROW_SCHEMA, PartitionRange, read_ranges
from dagster_streamgroup.streams.kafka_config import KafkaStreamConfig
from tests.fixtures.kafka import TopicFactory
from tests.integration.spark_cluster import recording
from tests.integration.spark_cluster.recording import DRIVER

pytestmark = [pytest.mark.spark_connect, pytest.mark.spark_cluster, pytest.mark.kafka, pytest.mark.slow]

SPLIT = 500
START_TIMEOUT_S = 300.0
READY = "Spark Connect server on sc://"

Row = tuple[Any, ...]


def spark_rows(rows: list[Any]) -> list[Row]:
    """Spark rows as plain values: timestamps in epoch ms, headers as (key, value) pairs, binaries as bytes."""
    out = []
    for r in rows:
        headers = [(h["key"], _bytes(h["value"])) for h in r["headers"]] if r["headers"] is not None else None
        out.append(
            (
                _bytes(r["key"]), _bytes(r["value"]), r["topic"], r["partition"], r["offset"],
                round(r["timestamp"].timestamp() * 1000), r["timestampType"], headers,
            )
        )  # fmt: skip
    return out


def _bytes(value: Any) -> bytes | None:
    return None if value is None else bytes(value)


def reader_rows(config: KafkaStreamConfig, pieces: list[ShardRange]) -> list[Row]:
    """The project's Kafka reader (no Spark) over the same pieces, in the same order, in the same form."""
    out: list[Row] = []
    for piece in pieces:
        topic, partition = piece.shard.rsplit(":", 1)
        ranges = [PartitionRange(topic, int(partition), piece.start, piece.end)]
        table = pa.Table.from_batches(list(read_ranges(config.client_config(), ranges)), KAFKA_ARROW_SCHEMA)
        for r in table.to_pylist():
            headers = [(h["key"], h["value"]) for h in r["headers"]] if r["headers"] is not None else None
            out.append(
                (
                    r["key"], r["value"], r["topic"], r["partition"], r["offset"],
                    round(r["timestamp"].timestamp() * 1000), r["timestampType"], headers,
                )
            )  # fmt: skip
    return out


def java_pids(root: int) -> set[int]:
    return {pid for pid in procfs.process_tree(root) if os.path.basename((procfs.cmdline(pid) or [b""])[0]) == b"java"}


@pytest.fixture
def connect_on_cluster(spark_cluster: SparkCluster, tmp_path: Path) -> Iterator[tuple[str, int]]:
    """``streamgroup local spark-connect`` on the cluster, as a user would start it; stopped by PID at the end."""
    port = free_port()
    command = [
        str(Path(sys.executable).parent / "streamgroup"), "local", "spark-connect",
        "--port", str(port), "--master", spark_cluster.master_url, "--driver-memory", "1g", "--rss-limit-mb", "0",
    ]  # fmt: skip
    for key, value in spark_cluster.application_config().items():
        if key != "spark.master":
            command += ["--conf", f"{key}={value}"]
    log_path = tmp_path / "connect.log"
    with log_path.open("wb") as log:
        server = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while READY not in log_path.read_text(errors="replace"):
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the Connect server did not start (exit {server.poll()}):\n{log_path.read_text()[-3000:]}")
            time.sleep(0.5)
        yield f"sc://127.0.0.1:{port}", server.pid
    finally:
        stop_process_tree(server.pid, timeout_s=60)


def test_connect_server_on_the_cluster_reads_in_its_executors(
    connect_on_cluster: tuple[str, int],
    spark_cluster: SparkCluster,
    kafka_bootstrap: str,
    kafka_topics: TopicFactory,
    tmp_path: Path,
) -> None:
    from pyspark.sql import SparkSession

    if SparkSession.getActiveSession() is not None:
        pytest.skip("PySpark refuses a Connect session in a process that runs a classic one: run with -m spark_connect")
    remote, server_pid = connect_on_cluster
    topic = kafka_topics(2, prefix="connect-cluster")
    ends = produce_sample(kafka_bootstrap, topic, 2, 3000)
    extra = produce_records(kafka_bootstrap, topic, 1, [b"h1", None], keys=[b"k1", None], headers=[[("t", b"1")], None])
    config = KafkaStreamConfig(bootstrap_servers=kafka_bootstrap, topics=[topic])
    ranges = {f"{topic}:0": (0, ends[0]), f"{topic}:1": (200, extra[-1] + 1)}
    single = ShardRange(f"{topic}:0", 10, 1210)
    reads = {
        "kafka_ranges": (
            lambda spark: read_kafka_ranges(spark, config, ranges, max_records_per_partition=SPLIT),
            plan_partitions([ShardRange(s, a, b) for s, (a, b) in ranges.items()], max_records_per_partition=SPLIT),
        ),
        "spark_read": (
            lambda spark: read_kafka_range(spark, config, single.shard, single.start, single.end, SPLIT),
            plan_partitions([single], max_records_per_partition=SPLIT),
        ),
    }

    resource = StreamSparkResource(remote=remote)
    spark = resource.spark_session
    directory = tmp_path / "records"
    try:
        recording.install(spark, directory)
        results = {
            name: (spark_rows(make(spark).collect()), recording.records(directory)) for name, (make, _) in reads.items()
        }
        app_id = spark.conf.get("spark.app.id")
    finally:
        spark.stop()

    executors = {e.pid: e.executor_id for e in spark_cluster.executor_processes() if e.app_id == app_id}
    assert len(executors) == len(spark_cluster.workers)
    server_jvms = java_pids(server_pid)
    assert server_jvms and not server_jvms & set(executors)
    for name, (_, planned) in reads.items():
        rows, records = results[name]
        assert len(planned) >= 3
        assert sorted(r.ranges for r in records) == sorted(((p.shard, p.start, p.end),) for p in planned)
        for record in records:
            assert record.jvm_pid in executors and record.executor_id == executors[record.jvm_pid] != DRIVER
            assert record.jvm_pid not in server_jvms and record.pid != os.getpid()
        assert {r.executor_id for r in records} == set(executors.values()), f"{name}: both workers' executors read"
        assert rows == reader_rows(config, planned), name
        assert len(rows) == sum(p.size for p in planned)
