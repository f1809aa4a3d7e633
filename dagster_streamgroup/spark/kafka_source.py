"""``spark.read.format("streamgroup-kafka")``: exact Kafka offset ranges as a DataFrame.

The schema is that of Spark's own Kafka source (key, value, topic, partition, offset, timestamp,
timestampType, headers), read by confluent-kafka inside the Spark tasks and handed to Spark as Arrow
batches. Options:

- ``ranges`` (required): JSON list of ``{"shard": "<topic>:<partition>", "start": s, "end": e}``;
- ``kafka.<property>``: librdkafka properties, e.g. ``kafka.bootstrap.servers`` (as Spark's Kafka source);
- ``minPartitions``, ``maxRecordsPerPartition``: split large ranges over more tasks; ``minRecordsPerPartition``:
  ranges smaller than this share a task until it holds this many records;
- ``batchSize`` (records per Arrow batch, 10000), ``stallTimeoutSeconds`` (30): give up on a range after
  this long without progress;
- ``formats``, ``readers``, ``writerSchemas`` (``formats.spark.decode_options``): typed records: ``key`` and ``value``
  decoded into the reader schemas' columns, with ``keySchemaId``, ``valueSchemaId`` and ``decodeError``.

Secret properties (``kafka.sasl.password`` ...) match Spark's ``spark.redaction.regex`` and are shown as
``*********(redacted)`` in plans; ``read_kafka_ranges`` builds them from a ``KafkaStreamConfig``.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Mapping, Sequence

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from dagster_streamgroup.spark.ranges import ShardRange, as_shard_ranges, ranges_to_json
from dagster_streamgroup.spark.reader import RangeReader, float_option
from dagster_streamgroup.streams.kafka import PartitionRange, parse_shard, read_ranges
from dagster_streamgroup.streams.kafka_config import KafkaStreamConfig, PropertyValue

FORMAT = "streamgroup-kafka"
KAFKA_PREFIX = "kafka."

SPARK_KAFKA_SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
        StructField(
            "headers", ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))
        ),
    ]
)


class KafkaRangeReader(RangeReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        super().__init__(options)
        self.client_config: dict[str, PropertyValue] = {
            key[len(KAFKA_PREFIX) :]: value for key, value in options.items() if key.startswith(KAFKA_PREFIX)
        }
        if "bootstrap.servers" not in self.client_config:
            raise ValueError("option 'kafka.bootstrap.servers' is required")
        self.stall_timeout_s = float_option(options, "stallTimeoutSeconds", 30.0)
        for r in self.ranges:
            parse_shard(r.shard)
        self.options = dict(options)

    def read_ranges(self, ranges: Sequence[ShardRange]) -> Iterator[pa.RecordBatch]:
        parts = []
        for r in ranges:
            topic, partition = parse_shard(r.shard)
            parts.append(PartitionRange(topic, partition, r.start, r.end))
        batches = read_ranges(
            self.client_config, parts, batch_size=self.batch_size, stall_timeout_s=self.stall_timeout_s
        )
        if "formats" not in self.options:
            return batches
        from dagster_streamgroup.formats.spark import decode_batches, decoder_from_options, keeps_raw

        decoder = decoder_from_options(self.options)
        assert decoder is not None
        return decode_batches(decoder, batches, keep_raw=keeps_raw(self.options))


class KafkaRangeDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        if "formats" not in self.options:
            return SPARK_KAFKA_SCHEMA
        from dagster_streamgroup.formats.spark import decoder_from_options, keeps_raw, spark_schema, typed_arrow_schema
        from dagster_streamgroup.streams.kafka import KAFKA_ARROW_SCHEMA

        decoder = decoder_from_options(self.options)
        assert decoder is not None
        return spark_schema(typed_arrow_schema(decoder, KAFKA_ARROW_SCHEMA, keep_raw=keeps_raw(self.options)))

    def reader(self, schema: StructType) -> DataSourceReader:
        return KafkaRangeReader(self.options)


_registered: weakref.WeakSet[SparkSession] = weakref.WeakSet()


def register(spark: SparkSession) -> None:
    """Register the source with a session (once: registration costs about a second)."""
    if spark in _registered:
        return
    spark.dataSource.register(KafkaRangeDataSource)
    _registered.add(spark)


def spark_options(config: KafkaStreamConfig) -> dict[str, str]:
    """``kafka.``-prefixed options for every librdkafka property, secrets included (Spark redacts them)."""
    out = {}
    for key, value in config.client_config().items():
        out[KAFKA_PREFIX + key] = str(value).lower() if isinstance(value, bool) else str(value)
    return out


def read_kafka_ranges(
    spark: SparkSession,
    config: KafkaStreamConfig,
    ranges: Mapping[str, tuple[int, int]] | Sequence[ShardRange],
    *,
    min_partitions: int | None = None,
    max_records_per_partition: int | None = None,
    min_records_per_partition: int | None = None,
    batch_size: int | None = None,
    stall_timeout_s: float | None = None,
    decode: Mapping[str, str] | None = None,
) -> DataFrame:
    """A DataFrame of exactly the records of ``ranges`` (``{"topic:p": (start, end)}`` or ShardRanges); typed
    when ``decode`` holds a run's formats (``formats.spark.decode_options``)."""
    register(spark)
    shard_ranges = as_shard_ranges(ranges)
    for r in shard_ranges:
        topic, _ = parse_shard(r.shard)
        if topic not in config.topics:
            raise ValueError(f"range {r.shard}: topic {topic!r} is not one of the stream's topics {config.topics}")
    options = {"ranges": ranges_to_json(shard_ranges), **spark_options(config), **(decode or {})}
    for name, value in (
        ("minPartitions", min_partitions),
        ("maxRecordsPerPartition", max_records_per_partition),
        ("minRecordsPerPartition", min_records_per_partition),
        ("batchSize", batch_size),
        ("stallTimeoutSeconds", stall_timeout_s),
    ):
        if value is not None:
            options[name] = str(value)
    return spark.read.format(FORMAT).options(**options).load()
