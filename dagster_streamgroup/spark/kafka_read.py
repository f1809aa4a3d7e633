"""Which reader a run's Kafka ranges go through: Spark's own Kafka source or our Python data source.

Both return exactly the records of the ranges with the same schema (tests compare them row for row); they differ
in where the work runs (the JVM's Kafka consumer against confluent-kafka in Python workers) and in what they
need (the connector on the classpath and settings the Java client can take, against nothing). ``auto`` picks
Spark's source where both hold and says why it did not otherwise, in the run's log."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING

from dagster_streamgroup.streams.kafka_config import KafkaStreamConfig

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

_connector_found: weakref.WeakKeyDictionary[SparkSession, bool] = weakref.WeakKeyDictionary()


def connector_loaded(spark: SparkSession, df: DataFrame) -> bool:
    """Whether ``df`` (a Spark Kafka source read) resolves: its schema is asked for once per session (one
    analysis round trip under Spark Connect), and a session without the connector answers with an error naming
    the ``kafka`` data source."""
    known = _connector_found.get(spark)
    if known is not None:
        return known
    try:
        df.schema  # noqa: B018 (resolving the plan is the check)
        found = True
    except Exception as exc:  # pyspark's AnalysisException, classic or Connect's, differ in class
        if "kafka" not in str(exc).lower() or "data source" not in str(exc).lower():
            raise
        found = False
    _connector_found[spark] = found
    return found


def read_kafka_ranges_by(
    reader: str,
    spark: SparkSession,
    config: KafkaStreamConfig,
    ranges: Mapping[str, tuple[int, int]],
    *,
    split_records: int,
    pack_records: int | None = None,
    decode: Mapping[str, str] | None = None,
) -> DataFrame:
    """The records of ``ranges`` through ``reader`` (``spark-kafka``, ``python`` or ``auto``); small ranges share
    a task up to ``pack_records`` through our source (Spark's plans a task per Kafka partition). ``decode``: typed
    records (``formats.spark.decode_options``), decoded in our source's tasks or, over Spark's source, by the same
    decoder through ``mapInArrow``."""
    from dagster_streamgroup.spark.kafka_source import read_kafka_ranges
    from dagster_streamgroup.spark.spark_kafka_source import SparkKafkaUnsupportedError, read_ranges_with_spark_kafka

    def ours() -> DataFrame:
        return read_kafka_ranges(
            spark,
            config,
            dict(ranges),
            max_records_per_partition=split_records,
            min_records_per_partition=pack_records,
            decode=decode,
        )

    def decoded(df: DataFrame) -> DataFrame:
        if not decode:
            return df
        from dagster_streamgroup.formats.spark import decode_dataframe

        return decode_dataframe(df, decode)

    if reader == "python":
        return ours()
    if reader == "spark-kafka":
        return decoded(read_ranges_with_spark_kafka(spark, config, ranges, max_records_per_partition=split_records))
    try:
        df = read_ranges_with_spark_kafka(spark, config, ranges, max_records_per_partition=split_records)
    except SparkKafkaUnsupportedError as exc:
        log.info("spark_reader auto: reading through the streamgroup-kafka source: %s", exc)
        return ours()
    if connector_loaded(spark, df):
        return decoded(df)
    log.info("spark_reader auto: no Spark Kafka source on this session's classpath; reading through streamgroup-kafka")
    return ours()
