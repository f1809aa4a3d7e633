"""Reading one offset range as a Spark DataFrame through the project's PySpark data source."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dagster_streamgroup.streams.kafka_config import KafkaStreamConfig

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def read_kafka_range(
    spark: SparkSession, config: KafkaStreamConfig, shard: str, start: int, end: int, split_records: int
) -> DataFrame:
    """The records of ``[start, end)`` of ``shard``, with Spark's Kafka schema (key, value, topic, ...);
    ranges larger than ``split_records`` are read by several Spark tasks."""
    from dagster_streamgroup.spark.kafka_source import read_kafka_ranges

    return read_kafka_ranges(spark, config, {shard: (start, end)}, max_records_per_partition=split_records)
