"""Page views per page and minute, from JSON click events keyed by user: two layouts, by ``CLICKSTREAM_SINK``.

``delta`` (what ``scripts/example.sh`` runs): the stream asset ``clicks`` writes each click's row, keeping its
source coordinates, into a Delta table partitioned by day (``sinks.DeltaSink``: each run replaces exactly its
ranges' rows in one commit, before it commits its ranges into the group), and the downstream asset
``page_views_per_minute`` keeps views per page and minute correct as ranges land (``jobs/page_views.py``), run
by Dagster's automation whenever clicks land.

``parquet`` (the default of the settings, which the benchmarks and the long tests compare across versions): the
stream asset ``page_views_per_minute`` writes per-range partials, one Parquet directory per range
(``range=<shard>-<start>-<end>``), in Spark's dynamic partition-overwrite mode: a retried or backfilled range
replaces its own earlier output and nothing else (``sinks.RangeFolderSink``).

The same functions serve both streams: only the columns holding the record's bytes and its shard are named
differently (``value``/``topic``+``partition`` in Spark's Kafka schema, ``data``/``shard`` in the
v3io one). The computation and the write are plain functions (``page_views``, ``write_page_views``) that the
asset calls, so other engines can run exactly them: ``bench.peer_spark_streaming`` does, in Spark Structured
Streaming's ``foreachBatch``.
"""

# No ``from __future__ import annotations`` here: Dagster checks an asset's ``context`` hint as an object.
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dagster as dg

from dagster_streamgroup.dagster import StreamRange, range_key, ranges_of, stream_asset, with_range_column
from dagster_streamgroup.sinks import DeltaSink
from jobs import page_views as views_table
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


def payload_column(df: "DataFrame") -> str:
    for name in PAYLOAD_COLUMNS:
        if name in df.columns:
            return name
    raise ValueError(f"no record payload column ({' or '.join(PAYLOAD_COLUMNS)}) among {df.columns}")


def event_column(df: "DataFrame") -> "Column":
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


def page_views(df: "DataFrame", ranges: Sequence[StreamRange]) -> "DataFrame":
    """Views and distinct users per range, page and minute of event time: the example's whole computation.

    A plain function of a DataFrame and its offset ranges, apart from the asset, so that anything holding
    records in Spark's Kafka schema (a run of ours, one Spark job over the same ranges, or Spark Structured
    Streaming's own Kafka source in ``bench.peer_spark_streaming``) computes exactly the same thing."""
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

    events = with_range_column(df, ranges).select("range", event_column(df).alias("e"))
    return events.groupBy(
        "range", F.col("e.page").alias("page"), F.date_trunc("minute", F.timestamp_millis("e.ts")).alias("minute")
    ).agg(F.count(F.lit(1)).alias("views"), F.countDistinct("e.user").alias("users"))


def write_page_views(per_minute: "DataFrame", output: str | Path) -> None:
    """Write ``page_views`` output under ``output``, one ``range=<shard>-<start>-<end>`` folder per range, in
    dynamic partition-overwrite mode: a range written again replaces its own folder and nothing else, so every
    writer of this sink (retries, backfills, another engine's micro-batches) keeps the others' ranges."""
    (
        per_minute.write.mode("overwrite")
        .option("partitionOverwriteMode", "dynamic")
        .partitionBy("range")
        .parquet(str(output))
    )


def click_rows(df: "DataFrame") -> "DataFrame":
    """Each click as a row: its source coordinates (Kafka's ``topic``, ``partition``, ``offset``, or v3io's
    ``shard``, ``sequence_number``), the event's fields, its minute and day (the table's partition)."""
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

    coordinates = ["topic", "partition", "offset"] if "topic" in df.columns else ["shard", "sequence_number"]
    event = F.from_json(F.col(payload_column(df)).cast("string"), EVENT_SCHEMA)
    at = F.timestamp_millis(event["ts"])
    return df.select(
        *coordinates,
        event["user"].alias("user"),
        event["page"].alias("page"),
        event["referrer"].alias("referrer"),
        at.alias("event_time"),
        F.date_trunc("minute", at).alias("minute"),
        F.to_date(at).alias("day"),
    )


CLICKS_SINK = DeltaSink(
    table=str(settings.CLICKS_TABLE),
    partition_by=["day"],
    # The downstream asset reads what each commit changed (inserted and deleted rows) from the change data feed.
    configuration={"delta.enableChangeDataFeed": "true"},
)

VIEWS_AUTOMATION = (
    dg.AutomationCondition.any_deps_match(dg.AutomationCondition.newly_updated()).since(
        dg.AutomationCondition.newly_requested()
    )
    & ~dg.AutomationCondition.in_progress()
).with_label("clicks landed since the last refresh was requested, none running")
"""Refresh once clicks landed: the stream asset's member runs are nearly always in progress, so Dagster's ``eager``
(which waits for its dependencies' runs to end) would not run. Clicks that land while a refresh runs are followed by
another refresh: the condition is reset by the request, not by the refresh's own materialization, as
``since_last_handled`` is (a refresh that read the table before they landed would then end the wait for them, and
the views would stay behind until more clicks land). The trigger and the reset are single conditions because
Dagster 1.13 compares their times only then (an ``|`` of conditions carries none, and the reset wins the tick)."""


def _delta_assets() -> tuple[dg.AssetsDefinition, dg.AssetsDefinition]:
    @stream_asset(group=settings.GROUP, name="clicks", kinds={"spark", settings.STREAM, "delta"}, sink=CLICKS_SINK)
    def clicks(context: dg.AssetExecutionContext, df: "DataFrame") -> "DataFrame":
        """Each click's row, with the record it came from, in a Delta table partitioned by day."""
        return click_rows(df)

    @dg.asset(
        name="page_views_per_minute",
        deps=[clicks.key],
        kinds={"delta"},
        automation_condition=VIEWS_AUTOMATION,
        description="Views and distinct users per page and minute, from the clicks table, kept correct as ranges land.",
    )
    def page_views_per_minute(context: dg.AssetExecutionContext) -> dg.MaterializeResult[Any]:
        done = views_table.refresh(settings.CLICKS_TABLE, settings.VIEWS_TABLE)
        context.log.info(
            f"clicks version {done.previous_version} -> {done.source_version}: {done.minutes} minute(s) recomputed"
        )
        return dg.MaterializeResult(
            metadata={
                "clicks_version": done.source_version if done.source_version is not None else -1,
                "minutes_recomputed": done.minutes,
                "rows_written": done.rows,
                "full_refresh": done.full,
                "table": dg.MetadataValue.path(str(settings.VIEWS_TABLE)),
            }
        )

    return clicks, page_views_per_minute


def _parquet_asset() -> dg.AssetsDefinition:
    @stream_asset(group=settings.GROUP, name="page_views_per_minute", kinds={"spark", settings.STREAM, "parquet"})
    def page_views_per_minute(context: dg.AssetExecutionContext, df: "DataFrame") -> dict[str, Any]:
        """Views and distinct users per page and minute of event time, per offset range."""
        write_page_views(page_views(df, ranges_of(context)), settings.OUTPUT)
        return {"output": dg.MetadataValue.path(str(settings.OUTPUT))}

    return page_views_per_minute


if settings.SINK == "delta":
    stream, page_views_per_minute = _delta_assets()
    ASSETS = [stream, page_views_per_minute]
    SENSORS: list[dg.AutomationConditionSensorDefinition] = [
        dg.AutomationConditionSensorDefinition(
            f"{settings.GROUP}_page_views",
            target=[page_views_per_minute],
            default_status=dg.DefaultSensorStatus.RUNNING,
            minimum_interval_seconds=int(settings.HEARTBEAT_S),
        )
    ]
else:
    stream = page_views_per_minute = _parquet_asset()
    ASSETS = [page_views_per_minute]
    SENSORS = []
"""``stream``: the stream asset (the member sensors' target); ``ASSETS`` and ``SENSORS``: what definitions.py adds."""
