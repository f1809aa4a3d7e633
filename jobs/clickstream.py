"""Page views per page and minute, from JSON click events keyed by user, one Parquet directory per range.

Each range writes (overwrites) only its own directory, so a retried or backfilled range replaces its
earlier output instead of adding to it: re-processing is idempotent. The same function serves both streams:
only the column holding the record's bytes is named differently (``value`` in Spark's Kafka schema, ``data``
in the v3io one).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import dagster as dg

from dagster_streamgroup.dagster import range_of, stream_asset
from jobs import settings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

EVENT_SCHEMA = "user STRING, page STRING, ts LONG, referrer STRING"
PAYLOAD_COLUMNS = ("value", "data")
"""The record bytes: ``value`` from the streamgroup-kafka source, ``data`` from the streamgroup-v3io source."""


def payload_column(df: DataFrame) -> str:
    for name in PAYLOAD_COLUMNS:
        if name in df.columns:
            return name
    raise ValueError(f"no record payload column ({' or '.join(PAYLOAD_COLUMNS)}) among {df.columns}")


def range_output(shard: str, start: int, end: int) -> str:
    return str(settings.OUTPUT / shard.replace(":", "-") / f"{start:012d}-{end:012d}")


@stream_asset(group=settings.GROUP, name="page_views_per_minute", kinds={"spark", settings.STREAM, "parquet"})
def page_views_per_minute(context: dg.AssetExecutionContext, df: DataFrame) -> dict[str, Any]:
    """Views and distinct users per page and minute of event time."""
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

    shard, start, end = range_of(context)
    events = df.select(F.from_json(F.col(payload_column(df)).cast("string"), EVENT_SCHEMA).alias("e")).select("e.*")
    per_minute = events.groupBy("page", F.date_trunc("minute", F.timestamp_millis("ts")).alias("minute")).agg(
        F.count(F.lit(1)).alias("views"), F.countDistinct("user").alias("users")
    )
    path = range_output(shard, start, end)
    per_minute.write.mode("overwrite").parquet(path)
    return {"output": dg.MetadataValue.path(path)}
