"""Reading one offset range as a Spark DataFrame, through the project's PySpark data source."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dagster_streamgroup.streams.kafka_config import KafkaStreamConfig

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def read_kafka_range(
    spark: SparkSession, config: KafkaStreamConfig, shard: str, start: int, end: int, split_records: int
) -> DataFrame:
    """The records of ``[start, end)`` of ``shard`` with Spark's Kafka schema (key, value, topic, ...)."""
    # Interim: read in the driver through the backend until the data source lands.
    import pyarrow as pa

    from dagster_streamgroup.streams.kafka import KafkaBackend

    backend = KafkaBackend(config)
    batches = list(backend.read_range(shard, start, end))
    table = pa.Table.from_batches(batches, schema=backend.arrow_schema)
    return spark.createDataFrame(table)
