"""Page views per page and minute, from JSON click events keyed by user, one Parquet directory per range.

A run holds one range of each of its member's ready shards; its output is written in one Spark job, one
directory per range (``range=<shard>-<start>-<end>``), in Spark's dynamic partition-overwrite mode: a
retried or backfilled range replaces its own earlier output and nothing else, so re-processing is
idempotent. The same function serves both streams: only the columns holding the record's bytes and its shard
are named differently (``value``/``topic``+``partition`` in Spark's Kafka schema, ``data``/``shard`` in the
v3io one). The computation and the write are plain functions (``page_views``, ``write_page_views``) that the
asset calls, so other engines can run exactly them: ``bench.peer_spark_streaming`` does, in Spark Structured
Streaming's ``foreachBatch``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dagster as dg

from dagster_streamgroup.dagster import StreamRange, range_key, ranges_of, stream_asset, with_range_column
from jobs import settings

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

EVENT_SCHEMA = "user STRING, page STRING, ts LONG, referrer STRING"
EVENT_AVRO = {
    "type": "record",
    "name": "Click",
    "namespace": "clickstream",
    "fields": [
        {"name": "user", "type": "string"},
        {"name": "page", "type": "string"},
        {"name": "ts", "type": "long"},
        {"name": "referrer", "type": "string"},
    ],
}
"""The events' Avro schema (``CLICKSTREAM_FORMAT=avro``): the same fields as ``EVENT_SCHEMA``."""
PAYLOAD_COLUMNS = ("value", "data")
"""The record bytes: ``value`` from the streamgroup-kafka source, ``data`` from the streamgroup-v3io source."""


def payload_column(df: DataFrame) -> str:
    for name in PAYLOAD_COLUMNS:
        if name in df.columns:
            return name
    raise ValueError(f"no record payload column ({' or '.join(PAYLOAD_COLUMNS)}) among {df.columns}")


def event_column(df: DataFrame) -> Column:
    """The event as a struct: the typed value itself (``CLICKSTREAM_FORMAT=avro``: the group decodes the records), or
    the JSON text parsed."""
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)
    from pyspark.sql.types import StructType

    column = payload_column(df)
    if isinstance(df.schema[column].dataType, StructType):
        return F.col(column)
    return F.from_json(F.col(column).cast("string"), EVENT_SCHEMA)


def range_directory(shard: str, start: int, end: int) -> str:
    """The folder name of a range's output (``range=<this>``), as ``with_range_column`` writes it."""
    return range_key(shard, start, end)


def range_output(shard: str, start: int, end: int) -> str:
    return str(settings.OUTPUT / f"range={range_directory(shard, start, end)}")


def page_views(df: DataFrame, ranges: Sequence[StreamRange]) -> DataFrame:
    """Views and distinct users per range, page and minute of event time: the example's whole computation.

    A plain function of a DataFrame and its offset ranges, apart from the asset, so that anything holding
    records in Spark's Kafka schema (a run of ours, one Spark job over the same ranges, or Spark Structured
    Streaming's own Kafka source in ``bench.peer_spark_streaming``) computes exactly the same thing."""
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

    events = with_range_column(df, ranges).select("range", event_column(df).alias("e"))
    return events.groupBy(
        "range", F.col("e.page").alias("page"), F.date_trunc("minute", F.timestamp_millis("e.ts")).alias("minute")
    ).agg(F.count(F.lit(1)).alias("views"), F.countDistinct("e.user").alias("users"))


def write_page_views(per_minute: DataFrame, output: str | Path) -> None:
    """Write ``page_views`` output under ``output``, one ``range=<shard>-<start>-<end>`` folder per range, in
    dynamic partition-overwrite mode: a range written again replaces its own folder and nothing else, so every
    writer of this sink (retries, backfills, another engine's micro-batches) keeps the others' ranges."""
    (
        per_minute.write.mode("overwrite")
        .option("partitionOverwriteMode", "dynamic")
        .partitionBy("range")
        .parquet(str(output))
    )


@stream_asset(group=settings.GROUP, name="page_views_per_minute", kinds={"spark", settings.STREAM, "parquet"})
def page_views_per_minute(context: dg.AssetExecutionContext, df: DataFrame) -> dict[str, Any]:
    """Views and distinct users per page and minute of event time, per offset range."""
    write_page_views(page_views(df, ranges_of(context)), settings.OUTPUT)
    return {"output": dg.MetadataValue.path(str(settings.OUTPUT))}
