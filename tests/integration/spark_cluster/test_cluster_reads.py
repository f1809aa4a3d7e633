"""The project's Spark sources on a real standalone cluster (a master and two workers on 127.0.0.1, see
tests/fixtures/spark_cluster.py). Through ``StreamSparkResource(master="spark://...")`` every partition of a read
is read inside an executor process of the workers, never in the driver, and each read returns the rows of the same
read in local mode, row for row and in the same order: Kafka ranges of several partitions with a large range split
(``read_kafka_ranges``), one split range through ``read_kafka_range`` (dagster/spark_read.py), v3io ranges, and a
stream asset's run as a member sensor requests it (its function sees the same rows, and the run commits).

The reads run once per mode in a module fixture (a session per mode, in this process: the local one first, then
the cluster one); the tests check what they recorded. Where each partition was read comes from the project's data
sources wrapped by tests/integration/spark_cluster/recording.py."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from pyspark.sql import DataFrame, SparkSession

from dagster_streamgroup.dagster import KafkaStreamGroup, member_sensors, stream_asset
from dagster_streamgroup.dagster.spark_read import read_kafka_range
from dagster_streamgroup.dagster.spark_session import StreamSparkResource
from dagster_streamgroup.local.kafka_data import produce_records, produce_sample
from dagster_streamgroup.local.spark_cluster import ExecutorProcess, SparkCluster
from dagster_streamgroup.local.v3io.testing import V3ioServerInfo
from dagster_streamgroup.spark.kafka_source import read_kafka_ranges
from dagster_streamgroup.spark.ranges import ShardRange, plan_partitions
from dagster_streamgroup.spark.v3io_source import read_v3io_ranges
from dagster_streamgroup.streams.kafka_config import KafkaStreamConfig
from dagster_streamgroup.streams.v3io_config import V3ioStreamConfig
from tests.fixtures.kafka import TopicFactory
from tests.fixtures.v3io import unique_v3io_name
from tests.integration.spark_cluster import recording
from tests.integration.spark_cluster.recording import DRIVER, ReadRecord

pytestmark = [pytest.mark.spark, pytest.mark.spark_cluster, pytest.mark.kafka, pytest.mark.v3io, pytest.mark.slow]

SPLIT = 600
"""Records per Spark partition: the large ranges below become several partitions each."""
KAFKA_PARTITIONS = 3
SAMPLE = 6000
V3IO_CONTAINER = "bigdata"

Switch = Callable[[StreamSparkResource], AbstractContextManager[SparkSession]]


@dataclass(frozen=True)
class Data:
    kafka: KafkaStreamConfig
    topic: str
    kafka_ranges: dict[str, tuple[int, int]]
    v3io: V3ioStreamConfig
    v3io_ranges: dict[str, tuple[int, int]]
    v3io_written: dict[int, list[bytes]]
    asset_ranges: dict[str, tuple[int, int]]
    """What a stream-asset run of a new group reads: every partition, from its start."""


@dataclass(frozen=True)
class Read:
    """One read in one mode: its rows in Spark's order, where each partition ran, and what was planned."""

    rows: list[tuple[Any, ...]]
    records: list[ReadRecord]
    planned: list[ShardRange]


@dataclass(frozen=True)
class AssetRun:
    """One stream-asset run: the Spark partitions it read, where, the rows its function saw, its commit."""

    read: Read
    success: bool
    committed: dict[str, int | None]


@dataclass(frozen=True)
class Leg:
    """All reads of one mode, and the processes of that session."""

    master: str
    driver_pid: int
    driver_jvm_pid: int
    executors: list[ExecutorProcess]
    reads: dict[str, Read]
    asset: AssetRun


def _read_plans(data: Data) -> dict[str, tuple[Callable[[SparkSession], DataFrame], list[ShardRange]]]:
    """Each read: how it is made through the project's API, and the Spark partitions it must be cut into."""
    kafka = [ShardRange(shard, start, end) for shard, (start, end) in data.kafka_ranges.items()]
    single = ShardRange(f"{data.topic}:0", 100, 1900)
    v3io = [ShardRange(shard, start, end) for shard, (start, end) in data.v3io_ranges.items()]
    return {
        "kafka_ranges": (
            lambda spark: read_kafka_ranges(
                spark, data.kafka, data.kafka_ranges, max_records_per_partition=SPLIT, batch_size=250
            ),
            plan_partitions(kafka, max_records_per_partition=SPLIT),
        ),
        "spark_read": (
            lambda spark: read_kafka_range(spark, data.kafka, single.shard, single.start, single.end, SPLIT),
            plan_partitions([single], max_records_per_partition=SPLIT),
        ),
        "v3io_ranges": (
            lambda spark: read_v3io_ranges(spark, data.v3io, data.v3io_ranges, max_records_per_partition=SPLIT),
            plan_partitions(v3io, max_records_per_partition=SPLIT),
        ),
    }


@pytest.fixture(scope="module")
def data(kafka_bootstrap: str, v3io_server: V3ioServerInfo) -> Iterator[Data]:
    import v3io.dataplane

    topics = TopicFactory(kafka_bootstrap)
    topic = topics(KAFKA_PARTITIONS, prefix="cluster")
    client = v3io.dataplane.Client(**v3io_server.client_kwargs())
    path = unique_v3io_name("cluster")
    try:
        ends = produce_sample(kafka_bootstrap, topic, KAFKA_PARTITIONS, SAMPLE)
        # Headers, a null key and set timestamps too, so every column crosses from the executors.
        extra = produce_records(
            kafka_bootstrap,
            topic,
            1,
            [b"h1", b"h2", None],
            keys=[b"k1", None, b"k3"],
            timestamps_ms=[1_700_000_000_000, 1_700_000_000_001, 1_700_000_000_002],
            headers=[[("trace", b"t1"), ("empty", None)], None, [("trace", b"t3")]],
        )
        client.stream.create(V3IO_CONTAINER, path, shard_count=2)
        written: dict[int, list[bytes]] = {0: [f"s0-{i}".encode() for i in range(1500)], 1: [b"s1-a", b"s1-b"]}
        for shard, values in written.items():
            for chunk in range(0, len(values), 1000):
                records = [{"shard_id": shard, "data": v} for v in values[chunk : chunk + 1000]]
                assert client.stream.put_records(V3IO_CONTAINER, path, records).output.failed_record_count == 0
        yield Data(
            kafka=KafkaStreamConfig(bootstrap_servers=kafka_bootstrap, topics=[topic]),
            topic=topic,
            kafka_ranges={
                f"{topic}:0": (0, ends[0]),  # 2001 records: 4 Spark partitions
                f"{topic}:1": (150, extra[-1] + 1),  # 1854, through the records with headers: 4
                f"{topic}:2": (1000, 1400),  # 1
            },
            v3io=V3ioStreamConfig(
                endpoint=v3io_server.endpoint,
                container=V3IO_CONTAINER,
                stream_path=path,
                access_key=v3io_server.access_key,
            ),
            v3io_ranges={"0": (1, 1501), "1": (1, 3)},  # v3io sequence numbers start at 1
            v3io_written=written,
            asset_ranges={f"{topic}:{p}": (0, end) for p, end in ({**ends, 1: extra[-1] + 1}).items()},
        )
    finally:
        client.close()
        topics.cleanup()


def _run_stream_asset(resource: StreamSparkResource, data: Data, directory: Path, state_dir: Path) -> AssetRun:
    """What the daemon does, in this process: a member sensor's tick plans one run over every partition of the
    topic, and the run materializes the stream asset with ``resource`` as its Spark (its function collects the
    DataFrame it is given), then commits."""
    group = f"g_{uuid.uuid4().hex[:10]}"
    streamgroup = KafkaStreamGroup(
        group=group,
        bootstrap_servers=data.kafka.bootstrap_servers,
        topics=[data.topic],
        store_url=f"sqlite:///{state_dir / (group + '.db')}",
        heartbeat_interval_s=1.0,
        session_timeout_s=30.0,
        join_grace_s=0.0,
        max_records_per_run=10_000,
        min_backlog=1,
        spark_split_records=SPLIT,
        spark_pack_records=None,  # a task per planned piece, as the executors' records are compared with
    )
    seen: list[tuple[Any, ...]] = []

    @stream_asset(group=group, name=f"events_{group}")
    def events(context: dg.AssetExecutionContext, df: DataFrame) -> None:
        seen.extend(tuple(row) for row in df.collect())

    sensor = member_sensors(events, members=1, heartbeat_interval_s=1)[0]
    with dg.instance_for_test() as instance:
        context = dg.build_sensor_context(
            instance=instance, sensor_name=sensor.name, resources={"streamgroup": streamgroup}
        )
        tick = sensor(context)
        assert isinstance(tick, dg.SensorResult) and tick.run_requests is not None and len(tick.run_requests) == 1
        request = tick.run_requests[0]
        assert request.tags is not None
        result = dg.materialize(
            [events],
            instance=instance,
            run_config=request.run_config,
            tags={**request.tags, "dagster/run_key": request.run_key or ""},
            resources={"streamgroup": streamgroup, "pyspark": resource},
            raise_on_error=False,
        )
    shards = [f"{data.topic}:{p}" for p in range(KAFKA_PARTITIONS)]
    ranges = [ShardRange(shard, start, end) for shard, (start, end) in data.asset_ranges.items()]
    planned = plan_partitions(ranges, max_records_per_partition=SPLIT)
    committed = streamgroup.backend().committed(group, shards)
    return AssetRun(Read(seen, recording.records(directory), planned), result.success, committed)


def _run_leg(
    spark: SparkSession,
    resource: StreamSparkResource,
    data: Data,
    directory: Path,
    state_dir: Path,
    cluster: SparkCluster | None,
) -> Leg:
    recording.install(spark, directory)
    reads = {}
    for name, (make, planned) in _read_plans(data).items():
        rows = [tuple(row) for row in make(spark).collect()]
        reads[name] = Read(rows, recording.records(directory), planned)
    asset = _run_stream_asset(resource, data, directory, state_dir)
    app = spark.sparkContext.applicationId
    executors = [e for e in cluster.executor_processes() if e.app_id == app] if cluster is not None else []
    return Leg(
        master=spark.sparkContext.master,
        driver_pid=os.getpid(),
        driver_jvm_pid=int(spark._jvm.ProcessHandle.current().pid()),  # type: ignore[attr-defined]
        executors=executors,
        reads=reads,
        asset=asset,
    )


@pytest.fixture(scope="module")
def legs(
    classic_sessions: Switch, spark_cluster: SparkCluster, data: Data, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Leg]:
    """The same reads in local mode, then on the cluster, each mode in a session of its own in this process."""
    directory = tmp_path_factory.mktemp("read-records")
    state_dir = tmp_path_factory.mktemp("group-state")
    out = {}
    local = StreamSparkResource(master="local[2]")
    with classic_sessions(local) as spark:
        out["local"] = _run_leg(spark, local, data, directory, state_dir, None)
    cluster = StreamSparkResource(master=spark_cluster.master_url, spark_config=spark_cluster.application_config())
    with classic_sessions(cluster) as spark:
        out["cluster"] = _run_leg(spark, cluster, data, directory, state_dir, spark_cluster)
    return out


def test_each_mode_ran_in_its_own_session(legs: dict[str, Leg], spark_cluster: SparkCluster) -> None:
    """The cluster session really is on the cluster (a process that already runs a local session would otherwise
    get that one back), with one executor per worker; both sessions share the driver JVM PySpark launched once."""
    assert legs["local"].master == "local[2]"
    assert legs["cluster"].master == spark_cluster.master_url
    assert sorted(e.worker_pid for e in legs["cluster"].executors) == sorted(w.pid for w in spark_cluster.workers)
    assert legs["local"].driver_jvm_pid == legs["cluster"].driver_jvm_pid


def assert_read_in_executors(cluster: Leg, read: Read, local: Leg, local_read: Read) -> None:
    """Every planned partition read exactly once, each under an executor JVM of this application (never the
    driver's JVM, never this process), by both executors; and the same recorder in local mode saw the driver."""
    assert len(read.planned) >= 3
    assert sorted(r.ranges for r in read.records) == sorted(((p.shard, p.start, p.end),) for p in read.planned)
    assert sum(r.rows for r in read.records) == len(read.rows) == sum(p.size for p in read.planned)
    executors = {e.pid: e.executor_id for e in cluster.executors}
    for record in read.records:
        assert record.jvm_pid in executors, f"partition {record.partition_id} read under JVM {record.jvm_pid}"
        assert record.executor_id == executors[record.jvm_pid] != DRIVER
        assert record.jvm_pid != cluster.driver_jvm_pid and record.pid != cluster.driver_pid
    assert {r.executor_id for r in read.records} == set(executors.values()), "both workers' executors read"
    assert {(r.jvm_pid, r.executor_id) for r in local_read.records} == {(local.driver_jvm_pid, DRIVER)}


@pytest.mark.parametrize("name", ["kafka_ranges", "spark_read", "v3io_ranges"])
def test_partitions_are_read_in_the_workers_executors(legs: dict[str, Leg], name: str) -> None:
    cluster, local = legs["cluster"], legs["local"]
    assert_read_in_executors(cluster, cluster.reads[name], local, local.reads[name])


@pytest.mark.parametrize("name", ["kafka_ranges", "spark_read", "v3io_ranges"])
def test_rows_equal_local_mode_row_for_row(legs: dict[str, Leg], name: str) -> None:
    local, cluster = legs["local"].reads[name], legs["cluster"].reads[name]
    assert len(cluster.rows) == sum(p.size for p in cluster.planned)
    assert cluster.rows == local.rows


def test_kafka_rows_are_the_records_written(legs: dict[str, Leg], data: Data) -> None:
    """Independent of either mode: offsets exactly the ranges in plan order, keys those produce_sample wrote
    (record i to partition i % 3), and the extra records' keys, headers and timestamps."""
    rows = legs["cluster"].reads["kafka_ranges"].rows
    expected = [(f"{data.topic}:{p}", o) for p, (s, e) in enumerate(data.kafka_ranges.values()) for o in range(s, e)]
    assert [(f"{r[2]}:{r[3]}", r[4]) for r in rows] == expected
    per_partition = SAMPLE // KAFKA_PARTITIONS
    for key, _value, _topic, partition, offset, *_ in rows:
        if offset < per_partition:
            assert key == str(offset * KAFKA_PARTITIONS + partition).encode()
    tail = [r for r in rows if r[3] == 1][-3:]
    assert [(r[0], r[1]) for r in tail] == [(b"k1", b"h1"), (None, b"h2"), (b"k3", None)]
    assert [round(r[5].timestamp() * 1000) for r in tail] == [1_700_000_000_000 + i for i in range(3)]
    assert [[tuple(h) for h in r[7]] if r[7] is not None else None for r in tail] == [
        [("trace", b"t1"), ("empty", None)],
        None,
        [("trace", b"t3")],
    ]


def test_v3io_rows_are_the_records_written(legs: dict[str, Leg], data: Data) -> None:
    rows = legs["cluster"].reads["v3io_ranges"].rows
    assert [(r[0], r[1], r[2]) for r in rows] == [
        (shard, i + 1, value) for shard, values in data.v3io_written.items() for i, value in enumerate(values)
    ]


def test_a_stream_asset_run_on_the_cluster_equals_the_local_run(legs: dict[str, Leg], data: Data) -> None:
    """A member sensor's run request, materialized with ``StreamSparkResource(master="spark://...")``: its ranges
    are read in the executors, its function sees the rows of the same run in local mode, row for row, and it
    commits every range."""
    cluster, local = legs["cluster"], legs["local"]
    for leg in (local, cluster):
        assert leg.asset.success
        assert leg.asset.committed == {shard: end for shard, (_, end) in data.asset_ranges.items()}
    assert_read_in_executors(cluster, cluster.asset.read, local, local.asset.read)
    assert len(cluster.asset.read.rows) == sum(end - start for start, end in data.asset_ranges.values())
    assert cluster.asset.read.rows == local.asset.read.rows
