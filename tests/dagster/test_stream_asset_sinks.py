"""A stream asset that declares its sink (real Spark local, the local broker, a Delta table on disk, a Kafka topic).

The function returns its rows; the run commits them into the sink, then its ranges into the group. The asset's
metadata says whether the sink replaces rows by their source coordinates (what a backfill relies on), and a
backfill over several committed ranges, with bounds of its own, replaces exactly their rows.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from deltalake import DeltaTable

from dagster_streamgroup.dagster import StreamSparkResource, sink_replaces_by_coordinates, stream_asset
from dagster_streamgroup.dagster.assets import TAG_REPLACES_BY_COORDINATES, TAG_SINK
from dagster_streamgroup.local.kafka_data import produce_sample
from dagster_streamgroup.sinks import DeltaSink, KafkaTopicSink, RangeFolderSink, SinkRun
from tests.dagster.helpers import SensorDriver, group_name, group_resource, sensors_for
from tests.dagster.test_stream_asset import materializations, refusal_of, run
from tests.fixtures.kafka import TopicFactory
from tests.integration.sinks.test_kafka_sink import read_all

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


@pytest.fixture(scope="module")
def spark() -> StreamSparkResource:
    return StreamSparkResource(master="local[1]")


def clicks_asset(group: str, sink: Any) -> dg.AssetsDefinition:
    @stream_asset(group=group, name=f"clicks_{group}", sink=sink)
    def clicks(context: dg.AssetExecutionContext, df: Any) -> Any:
        """Each record's row, keeping its source coordinates; the key and value as text."""
        return df.selectExpr("topic", "partition", "offset", "cast(key as string) as user", "value")

    return clicks


def test_a_delta_sink_gets_each_runs_rows_before_its_commit_and_a_backfill_replaces_them(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path, spark: StreamSparkResource
) -> None:
    topic = kafka_topics(partitions=2)
    produce_sample(kafka_bootstrap, topic, 2, 100)  # 51 records per partition
    group = group_name()
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path, max_records_per_run=60)
    sink = DeltaSink(table=str(tmp_path / "clicks"))
    asset = clicks_asset(group, sink)
    assert sink_replaces_by_coordinates(asset)
    assert asset.metadata_by_key[asset.key][TAG_SINK] == "delta"
    with dg.instance_for_test() as instance:
        driver = SensorDriver(sensors_for(asset, members=1)[0], instance, resource)
        for expected in (60, 42):  # two runs, of 30 then 21 records per partition
            result = run(asset, instance, resource, spark, driver.request())
            assert result.success
            for m in materializations(result).values():
                assert (m["sink"], m["sink_target"], m["sink_rows"]) == ("delta", sink.table, expected)
        table = DeltaTable(sink.table)
        rows = table.to_pyarrow_table()
        assert rows.num_rows == 102 and rows.column_names[:3] == ["topic", "partition", "offset"]
        assert sink.table_offsets([f"{topic}:0", f"{topic}:1"]) == {f"{topic}:0": 51, f"{topic}:1": 51}
        # A backfill of [10, 51) of one shard, over the two committed ranges' bounds: exactly its records' rows.
        before = table.version()
        backfill = run(asset, instance, resource, spark, (f"{topic}:0", 10, 51))
        assert backfill.success
        after = DeltaTable(sink.table)
        assert after.version() == before + 1
        counts = Counter(
            zip(*after.to_pyarrow_table().select(["partition", "offset"]).to_pydict().values(), strict=True)
        )
        assert set(counts.values()) == {1} and len(counts) == 102, "each record once after the backfill"
        assert after.history(1)[0]["streamgroup.ranges"] == f'[["{topic}:0", 10, 51]]'


def test_a_kafka_sink_through_a_stream_asset_writes_each_record_once_across_a_rerun(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path, spark: StreamSparkResource
) -> None:
    topic = kafka_topics(partitions=2)
    output = kafka_topics(partitions=2, prefix="out")
    produce_sample(kafka_bootstrap, topic, 2, 40)
    group = group_name()
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path)
    sink = KafkaTopicSink(topic=output, key_column="user")  # the group's own connection
    asset = clicks_asset(group, sink)
    assert not sink_replaces_by_coordinates(asset)
    with dg.instance_for_test() as instance:
        driver = SensorDriver(sensors_for(asset, members=1)[0], instance, resource)
        request = driver.request()
        assert run(asset, instance, resource, spark, request).success
        # A backfill of the same records (nothing committed by it): the sink finds them out already.
        backfill = run(asset, instance, resource, spark, (f"{topic}:0", 0, 21))
        assert backfill.success
        (m,) = materializations(backfill).values()
        assert m["sink_rows"] == 0 and m["sink_ranges_already_written"] == 1
        got = read_all(kafka_bootstrap, output, 2)
        assert Counter(h for h, _ in got) == Counter(f"{topic}:{p}:{o}" for p in (0, 1) for o in range(21))
        marker = SinkRun(group, kafka_client=lambda: {"bootstrap.servers": kafka_bootstrap})
        shards = [f"{topic}:0", f"{topic}:1"]
        assert sink.committed(shards, marker) == dict.fromkeys(shards, 21), "the sink's group offsets"


def test_a_function_that_returns_metadata_to_a_declared_sink_fails_before_anything_is_committed(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path, spark: StreamSparkResource
) -> None:
    topic = kafka_topics(partitions=1)
    produce_sample(kafka_bootstrap, topic, 1, 10)
    group = group_name()
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path)

    @stream_asset(group=group, name=f"wrong_{group}", sink=RangeFolderSink(path=str(tmp_path / "out")))
    def wrong(context: dg.AssetExecutionContext, df: Any) -> dict[str, Any]:
        return {"rows": 1}

    assert wrong.metadata_by_key[wrong.key][TAG_REPLACES_BY_COORDINATES] is False
    with dg.instance_for_test() as instance:
        driver = SensorDriver(sensors_for(wrong, members=1)[0], instance, resource)
        result = run(wrong, instance, resource, spark, driver.request())
        assert not result.success
        assert "returned no rows for it" in refusal_of(result)
        state = resource.member(driver.member_id).load()
        assert state is not None and state.shards[f"{topic}:0"].committed == 0


@pytest.mark.slow
@pytest.mark.spark_connect
def test_a_delta_sink_over_spark_connect(kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path) -> None:
    """The rows reach the run's process over Spark Connect (``DataFrame.toArrow()`` of a Connect session), as
    ``scripts/example.sh`` runs them."""
    from pyspark.sql import SparkSession

    from dagster_streamgroup.local.spark_connect import running_connect_server

    if SparkSession.getActiveSession() is not None:
        pytest.skip(
            "PySpark refuses a Connect session in a process that already runs a classic one (an earlier test's); "
            "scripts/test.sh runs it in a pytest of its own (-m spark_connect)"
        )
    topic = kafka_topics(partitions=2)
    produce_sample(kafka_bootstrap, topic, 2, 100)
    group = group_name()
    resource = group_resource(kafka_bootstrap, topic, group, tmp_path, max_records_per_run=60)
    sink = DeltaSink(table=str(tmp_path / "clicks"), partition_by=["partition"])
    asset = clicks_asset(group, sink)
    with running_connect_server() as server, dg.instance_for_test() as instance:
        remote = StreamSparkResource(remote=server.remote)
        driver = SensorDriver(sensors_for(asset, members=1)[0], instance, resource)
        for _ in range(2):
            assert run(asset, instance, resource, remote, driver.request()).success
    rows = DeltaTable(sink.table).to_pyarrow_table()
    keys = list(zip(rows.column("partition").to_pylist(), rows.column("offset").to_pylist(), strict=True))
    assert sorted(keys) == [(p, o) for p in (0, 1) for o in range(51)]
