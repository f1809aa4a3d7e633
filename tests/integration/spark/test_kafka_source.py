"""The ``streamgroup-kafka`` Spark source against the real local broker: exact ranges, splitting, failures."""

from __future__ import annotations

import contextlib
import io
import time
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import to_arrow_schema

from dagster_streamgroup.spark.kafka_source import SPARK_KAFKA_SCHEMA, read_kafka_ranges
from dagster_streamgroup.spark.ranges import ShardRange
from dagster_streamgroup.streams.kafka import KAFKA_ARROW_SCHEMA
from dagster_streamgroup.streams.kafka_config import KafkaStreamConfig

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

Row = tuple[Any, ...]


def plain_consumer_rows(bootstrap: str, ranges: dict[str, tuple[int, int]]) -> list[Row]:
    """An independent reference: a bare confluent-kafka loop, one partition at a time, message by message."""
    rows: list[Row] = []
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "reference",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        for shard, (start, end) in ranges.items():
            topic, partition = shard.rsplit(":", 1)
            consumer.assign([TopicPartition(topic, int(partition), start)])
            deadline = time.monotonic() + 30
            done = start >= end
            while not done:
                assert time.monotonic() < deadline, f"reference read of {shard} did not finish"
                msg = consumer.poll(0.5)
                if msg is None:
                    continue
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF and msg.offset() >= end:
                        done = True
                    continue
                if msg.offset() >= end:
                    done = True
                    continue
                ts_type, ts = msg.timestamp()
                headers = [(k, v) for k, v in msg.headers()] if msg.headers() else None
                rows.append(
                    (msg.key(), msg.value(), msg.topic(), msg.partition(), msg.offset(), ts, ts_type - 1, headers)
                )
                done = msg.offset() >= end - 1
    finally:
        consumer.close()
    return sorted(rows, key=lambda r: (r[2], r[3], r[4]))


def spark_rows(df: DataFrame) -> list[Row]:
    rows = []
    for r in df.collect():
        headers = [(h["key"], h["value"]) for h in r["headers"]] if r["headers"] is not None else None
        ms = round(r["timestamp"].timestamp() * 1000)
        rows.append((r["key"], r["value"], r["topic"], r["partition"], r["offset"], ms, r["timestampType"], headers))
    return sorted(rows, key=lambda r: (r[2], r[3], r[4]))


def test_the_arrow_schema_is_exactly_what_spark_expects() -> None:
    assert to_arrow_schema(SPARK_KAFKA_SCHEMA, timezone="UTC").equals(KAFKA_ARROW_SCHEMA)


def test_the_dataframe_equals_a_plain_consumer_read_row_for_row(
    spark: SparkSession, data: tuple[KafkaStreamConfig, str, dict[int, int]]
) -> None:
    config, topic, ends = data
    ranges = {f"{topic}:0": (0, ends[0]), f"{topic}:1": (300, 1234), f"{topic}:2": (ends[2] - 50, ends[2])}
    df = read_kafka_ranges(spark, config, ranges)
    assert df.schema == SPARK_KAFKA_SCHEMA
    got = spark_rows(df)
    expected = plain_consumer_rows(config.bootstrap_servers, ranges)
    assert len(got) == ends[0] + 934 + 50
    assert got == expected
    assert any(r[7] for r in got), "the records with headers are part of the comparison"


def test_large_ranges_split_over_several_tasks_without_loss_or_duplicates(
    spark: SparkSession, data: tuple[KafkaStreamConfig, str, dict[int, int]]
) -> None:
    config, topic, _ = data
    ranges = [ShardRange(f"{topic}:0", 10, 1510), ShardRange(f"{topic}:1", 0, 100)]
    df = read_kafka_ranges(spark, config, ranges, max_records_per_partition=400)
    assert df.rdd.getNumPartitions() == 4 + 1
    offsets = [(r["partition"], r["offset"]) for r in df.select("partition", "offset").collect()]
    assert sorted(offsets) == [(0, o) for o in range(10, 1510)] + [(1, o) for o in range(100)]
    by_min = read_kafka_ranges(spark, config, ranges, min_partitions=6)
    assert by_min.rdd.getNumPartitions() >= 6
    assert by_min.count() == 1600


def test_small_ranges_share_a_task_and_large_ones_keep_theirs(
    spark: SparkSession, data: tuple[KafkaStreamConfig, str, dict[int, int]]
) -> None:
    """``minRecordsPerPartition``: the two small ranges are read by one consumer in one task, the large one
    split in two as before; the rows are exactly the ranges' records, each shard's in offset order."""
    config, topic, _ = data
    ranges = [ShardRange(f"{topic}:0", 10, 1210), ShardRange(f"{topic}:1", 0, 100), ShardRange(f"{topic}:2", 5, 55)]
    df = read_kafka_ranges(spark, config, ranges, max_records_per_partition=600, min_records_per_partition=500)
    assert df.rdd.getNumPartitions() == 2 + 1
    rows = [(r["partition"], r["offset"]) for r in df.select("partition", "offset").collect()]
    expected = [(0, o) for o in range(10, 1210)] + [(1, o) for o in range(100)] + [(2, o) for o in range(5, 55)]
    assert sorted(rows) == expected
    for partition in (1, 2):
        offsets = [o for p, o in rows if p == partition]
        assert offsets == sorted(offsets), "a shard's records in order within the shared task"
    with pytest.raises(Exception, match="minRecordsPerPartition must be >= 1"):
        read_kafka_ranges(spark, config, ranges, min_records_per_partition=0).count()


def test_empty_ranges_give_an_empty_dataframe(
    spark: SparkSession, data: tuple[KafkaStreamConfig, str, dict[int, int]]
) -> None:
    config, topic, _ = data
    assert read_kafka_ranges(spark, config, {f"{topic}:0": (5, 5)}).count() == 0


def test_a_range_that_cannot_be_completed_fails_with_a_clear_message(
    spark: SparkSession, data: tuple[KafkaStreamConfig, str, dict[int, int]]
) -> None:
    config, topic, ends = data
    df = read_kafka_ranges(spark, config, {f"{topic}:1": (ends[1] - 5, ends[1] + 5)}, stall_timeout_s=1.0)
    with pytest.raises(Exception, match="range could not be completed") as caught:
        df.count()
    assert f"{topic}:1" in str(caught.value)


def test_bad_options_fail_at_planning_with_the_option_named(
    spark: SparkSession, data: tuple[KafkaStreamConfig, str, dict[int, int]]
) -> None:
    config, topic, _ = data
    with pytest.raises(Exception, match="need 0 <= start <= end"):
        read_kafka_ranges(spark, config, {f"{topic}:0": (9, 3)})

    def reader() -> Any:
        return spark.read.format("streamgroup-kafka").option("kafka.bootstrap.servers", config.bootstrap_servers)

    with pytest.raises(Exception, match="'maxRecordsPerPartition' must be an integer"):
        reader().option("ranges", f'[{{"shard": "{topic}:0", "start": 0, "end": 3}}]').option(
            "maxRecordsPerPartition", "many"
        ).load().count()
    with pytest.raises(Exception, match="option 'ranges' is required"):
        reader().load().count()


def test_secrets_do_not_appear_in_query_plans(spark: SparkSession) -> None:
    secret = "Sup3r-s3cret-pw"
    config = KafkaStreamConfig(
        bootstrap_servers="127.0.0.1:9",
        topics=["t"],
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_username="u",
        sasl_password=secret,
    )
    df = read_kafka_ranges(spark, config, {"t:0": (0, 10)})
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        df.explain(mode="extended")
        df.explain(mode="formatted")
    assert "streamgroup-kafka" in out.getvalue()
    assert secret not in out.getvalue()
