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
    from pyspark.sql import Column, DataFrame

RANGE_COLUMN = "range"


def range_key(shard: str, start: int, end: int) -> str:
    """``<shard>-<start>-<end>``, the offsets zero-padded so keys sort in offset order; safe as a directory name
    (``topic:partition`` becomes ``topic-partition``)."""
    return f"{shard.replace(':', '-').replace('/', '-')}-{start:012d}-{end:012d}"


def with_range_column(df: DataFrame, ranges: Sequence[StreamRange], name: str = RANGE_COLUMN) -> DataFrame:
    """``df`` with a column naming each row's range (``range_key``), from the rows' shard (Kafka's ``topic``
    and ``partition``, v3io's ``shard``) and, where a shard has several ranges (a backfill re-processes many of a
    shard's ranges in one read), its offset: write with ``partitionBy(name)`` and ``partitionOverwriteMode=dynamic``
    to keep every range's output."""
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

    kafka = "topic" in df.columns
    shard = F.concat_ws(":", "topic", "partition") if kafka else F.col("shard").cast("string")
    offset = F.col("offset" if kafka else "sequence_number")
    by_shard: dict[str, list[StreamRange]] = {}
    for r in ranges:
        by_shard.setdefault(r.shard, []).append(r)
    key = F.lit(None).cast("string")
    for shard_id, of_shard in by_shard.items():
        key = F.when(shard == F.lit(shard_id), _by_offset(offset, sorted(of_shard, key=lambda r: r.start))).otherwise(
            key
        )
    return df.withColumn(name, key)


def _by_offset(offset: Column, ranges: Sequence[StreamRange]) -> Column:
    """The key of the range holding each row's offset, as a balanced tree of comparisons: a wave of a backfill holds
    thousands of a shard's ranges, and a chain of that many ``when``s would nest as deep (Spark plans and Spark
    Connect's messages recurse over it) and compare a row against each."""
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

    if len(ranges) == 1:
        only = ranges[0]
        return F.lit(range_key(only.shard, only.start, only.end))
    middle = len(ranges) // 2
    return F.when(offset < F.lit(ranges[middle].start), _by_offset(offset, ranges[:middle])).otherwise(
        _by_offset(offset, ranges[middle:])
    )
