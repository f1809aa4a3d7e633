"""Keying a run's output by its offset ranges, so every retry, relaunch or backfill of a range replaces only that
range's output.

A run's ranges come back with the same bounds when they run again (a failed range's retry, a range handed over
after a drain expiry or a dead run, a launch that raised), so output written under a key of
``(shard, start, end)`` with Spark's dynamic partition overwrite is replaced by the range's next run and
never counted twice; output keyed by shard alone would have each range delete the shard's earlier ranges.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from dagster_streamgroup.dagster.assets import StreamRange

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

RANGE_COLUMN = "range"


def range_key(shard: str, start: int, end: int) -> str:
    """``<shard>-<start>-<end>``, the offsets zero-padded so keys sort in offset order; safe as a directory name
    (``topic:partition`` becomes ``topic-partition``)."""
    return f"{shard.replace(':', '-').replace('/', '-')}-{start:012d}-{end:012d}"


def with_range_column(df: DataFrame, ranges: Sequence[StreamRange], name: str = RANGE_COLUMN) -> DataFrame:
    """``df`` with a column naming each row's range (``range_key``), from the rows' shard (Kafka's ``topic``
    and ``partition``, v3io's ``shard``): write with ``partitionBy(name)`` and
    ``partitionOverwriteMode=dynamic`` to keep every range's output."""
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

    shard = F.concat_ws(":", "topic", "partition") if "topic" in df.columns else F.col("shard").cast("string")
    key = F.lit(None).cast("string")
    for r in ranges:
        key = F.when(shard == F.lit(r.shard), F.lit(range_key(r.shard, r.start, r.end))).otherwise(key)
    return df.withColumn(name, key)
