"""Exact ranges read through Spark's own Kafka source, against the real broker, row for row against the Python
source and an independent consumer: plain, split, empty, transactional (aborted records and markers inside a
range), compacted-looking gaps, and retention past a range's start."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient
from pyspark.sql import SparkSession

from dagster_streamgroup.dagster import KafkaStreamGroup
from dagster_streamgroup.local.kafka_broker import BrokerInfo
from dagster_streamgroup.local.kafka_data import produce_sample
from dagster_streamgroup.spark.kafka_source import SPARK_KAFKA_SCHEMA, read_kafka_ranges
from dagster_streamgroup.spark.ranges import ShardRange, as_shard_ranges
from dagster_streamgroup.spark.spark_kafka_source import read_options, read_ranges_with_spark_kafka
from dagster_streamgroup.streams.base import OffsetOutOfRangeError, RangeIncompleteError
from dagster_streamgroup.streams.kafka_config import KafkaStreamConfig
from tests.fixtures.kafka import TopicFactory
from tests.integration.kafka.test_real_broker_behaviour import (
    COMPACTED,
    _plain_read,
    _topic_with_config,
    _until,
    _write_compactable,
)
from tests.integration.kafka.test_transactions import Transactions
from tests.integration.spark.test_kafka_source import plain_consumer_rows, spark_rows

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


def test_the_dataframe_equals_the_python_source_and_a_plain_consumer_row_for_row(
    spark: SparkSession, data: tuple[KafkaStreamConfig, str, dict[int, int]]
) -> None:
    config, topic, ends = data
    ranges = {f"{topic}:0": (0, ends[0]), f"{topic}:1": (300, 1234), f"{topic}:2": (ends[2] - 50, ends[2])}
    df = read_ranges_with_spark_kafka(spark, config, ranges)
    assert df.schema == SPARK_KAFKA_SCHEMA
    got = spark_rows(df)
    assert len(got) == ends[0] + 934 + 50
    assert got == plain_consumer_rows(config.bootstrap_servers, ranges)
    assert got == spark_rows(read_kafka_ranges(spark, config, ranges))
    assert any(r[7] for r in got), "the records with headers are part of the comparison"


def test_large_ranges_split_over_several_tasks_without_loss_or_duplicates(
    spark: SparkSession, data: tuple[KafkaStreamConfig, str, dict[int, int]]
) -> None:
    config, topic, _ = data
    ranges = [ShardRange(f"{topic}:0", 10, 1510), ShardRange(f"{topic}:1", 0, 100)]
    df = read_ranges_with_spark_kafka(spark, config, ranges, max_records_per_partition=400)
    assert df.rdd.getNumPartitions() >= 5
    offsets = sorted((r["partition"], r["offset"]) for r in df.select("partition", "offset").collect())
    assert offsets == [(0, o) for o in range(10, 1510)] + [(1, o) for o in range(100)]


def test_an_empty_range_gives_no_rows(spark: SparkSession, data: tuple[KafkaStreamConfig, str, dict[int, int]]) -> None:
    config, topic, _ = data
    assert read_ranges_with_spark_kafka(spark, config, {f"{topic}:0": (5, 5)}).count() == 0


def test_two_ranges_of_one_partition_in_one_read_are_refused(
    data: tuple[KafkaStreamConfig, str, dict[int, int]],
) -> None:
    config, topic, _ = data
    with pytest.raises(ValueError, match="two ranges of the same partition"):
        read_ranges_with_spark_kafka(
            None,  # type: ignore[arg-type]  # refused while planning, before any session is used
            config,
            [ShardRange(f"{topic}:0", 0, 5), ShardRange(f"{topic}:0", 5, 9)],
        )


def test_a_transactional_range_holds_exactly_the_committed_records_as_the_python_source_reads(
    spark: SparkSession, kafka_bootstrap: str, kafka_topics: TopicFactory
) -> None:
    topic = kafka_topics(1, prefix="spark-kafka-tx")
    tx = Transactions(kafka_bootstrap, topic)
    tx.commit(40)
    tx.abort(25)
    tx.commit(30)
    tx.abort(5)
    tx.commit(10)
    config = KafkaStreamConfig(bootstrap_servers=kafka_bootstrap, topics=[topic])
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    from confluent_kafka.admin import OffsetSpec

    end = admin.list_offsets({TopicPartition(topic, 0): OffsetSpec.latest()})[TopicPartition(topic, 0)].result().offset
    ranges = {f"{topic}:0": (0, end)}
    ours = read_ranges_with_spark_kafka(spark, config, ranges)
    values = [r["value"] for r in ours.orderBy("offset").select("value").collect()]
    assert values == tx.committed_values
    assert spark_rows(ours) == spark_rows(read_kafka_ranges(spark, config, ranges))
    # A range that ends inside the aborted transaction's offsets still holds only the committed records before it.
    middle = {f"{topic}:0": (20, 55)}
    middle_values = [r["value"] for r in read_ranges_with_spark_kafka(spark, config, middle).collect()]
    assert middle_values == tx.committed_values[20:40]


def test_a_range_whose_start_retention_deleted_fails_naming_the_shard_instead_of_skipping(
    spark: SparkSession, kafka_bootstrap: str, kafka_topics: TopicFactory
) -> None:
    topic = kafka_topics(1, prefix="spark-kafka-deleted")
    ends = produce_sample(kafka_bootstrap, topic, 1, 500, value_size=10)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    deleted = admin.delete_records([TopicPartition(topic, 0, 200)])
    for future in deleted.values():
        future.result(30)
    config = KafkaStreamConfig(bootstrap_servers=kafka_bootstrap, topics=[topic])
    deadline = time.monotonic() + 30
    with pytest.raises(OffsetOutOfRangeError, match=f"{topic}:0"):
        while time.monotonic() < deadline:  # the log start moves once the broker has applied the deletion
            read_ranges_with_spark_kafka(spark, config, {f"{topic}:0": (100, ends[0])})
            time.sleep(0.5)
    kept = read_ranges_with_spark_kafka(spark, config, {f"{topic}:0": (200, ends[0])})
    assert sorted(r["offset"] for r in kept.select("offset").collect()) == list(range(200, ends[0]))


@pytest.mark.parametrize(
    ("properties", "relation"),
    [({}, "KafkaRelation"), ({"queued.min.messages": "1000"}, "streamgroup-kafka")],
    ids=["translatable settings: Spark's source", "a librdkafka-only property: the Python source"],
)
def test_the_resource_reads_through_the_reader_auto_picks(
    spark: SparkSession, data: tuple[KafkaStreamConfig, str, dict[int, int]], tmp_path: Path,
    properties: dict[str, str], relation: str,
) -> None:  # fmt: skip
    config, topic, ends = data
    resource = KafkaStreamGroup(
        group="auto-reader",
        bootstrap_servers=config.bootstrap_servers,
        topics=[topic],
        properties=properties,
        store_url=f"sqlite:///{tmp_path / 'state.db'}",
        spark_reader="auto",
    )
    df = resource.read_ranges(spark, {f"{topic}:0": (0, ends[0])})
    assert relation in df._jdf.queryExecution().optimizedPlan().toString()
    assert df.count() == ends[0]


def test_a_range_past_the_end_of_its_partition_fails_instead_of_giving_a_short_dataframe(
    spark: SparkSession, kafka_bootstrap: str, kafka_topics: TopicFactory
) -> None:
    """A range planned over a partition that now holds fewer records (a topic recreated or truncated under it)
    must fail, as the Python reader's does (``RangeIncompleteError``), and nothing be committed. Spark's source
    used to run with ``failOnDataLoss=false``: ``[0, 150)`` over 100 records gave 100 rows and a WARN. The read
    checks each range's end against what the partition holds first, and Spark's own check is on too, for records
    that vanish between that check and the read."""
    topic = kafka_topics(1, prefix="spark-kafka-short")
    [end] = produce_sample(kafka_bootstrap, topic, 1, 99, value_size=10).values()
    config = KafkaStreamConfig(bootstrap_servers=kafka_bootstrap, topics=[topic])
    short = {f"{topic}:0": (0, end + 50)}
    with pytest.raises(RangeIncompleteError, match=rf"{topic}:0 \[0, {end + 50}\).*ends at {end}"):
        read_ranges_with_spark_kafka(spark, config, short).count()
    # Spark's own check alone, without ours: its consumer waits a poll timeout (2 minutes by default) before it
    # looks at the partition's end and reports the loss.
    options = {**read_options(config, as_shard_ranges(short)), "kafkaConsumer.pollTimeoutMs": "3000"}
    unchecked = spark.read.format("kafka").options(**options).load()
    with pytest.raises(Exception, match=r"(?i)data.?loss|offset"):
        unchecked.count()
    assert read_ranges_with_spark_kafka(spark, config, {f"{topic}:0": (0, end)}).count() == end


def test_a_compacted_range_reads_its_surviving_records_with_spark_checking_for_loss(
    spark: SparkSession, kafka_broker: BrokerInfo, kafka_topics: TopicFactory
) -> None:
    """Holes that compaction leaves are not data loss: Spark's source (``failOnDataLoss=true``) reads the
    survivors, exactly as the Python source and a plain consumer do."""
    if kafka_broker.pid is None:
        pytest.skip("needs the local broker's fast housekeeping (the cleaner checked every second)")
    bootstrap = kafka_broker.bootstrap
    topic = _topic_with_config(kafka_topics, 1, COMPACTED, "spark-kafka-compacted")
    last = _write_compactable(bootstrap, topic)
    survivors = sorted(last.values())
    _until(lambda: [o for o, _k, _v in _plain_read(bootstrap, topic, 0)] == survivors, "a complete compaction")
    config = KafkaStreamConfig(bootstrap_servers=bootstrap, topics=[topic])
    ranges = {f"{topic}:0": (0, max(survivors) + 1)}
    rows = spark_rows(read_ranges_with_spark_kafka(spark, config, ranges))
    assert [r[4] for r in rows] == survivors
    assert rows == spark_rows(read_kafka_ranges(spark, config, ranges))
    middle = {f"{topic}:0": (survivors[1] + 1, survivors[-2])}  # starts and ends in holes
    assert [r[4] for r in spark_rows(read_ranges_with_spark_kafka(spark, config, middle))] == [
        o for o in survivors if middle[f"{topic}:0"][0] <= o < middle[f"{topic}:0"][1]
    ]
