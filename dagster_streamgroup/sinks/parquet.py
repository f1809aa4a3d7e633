"""One Parquet folder per offset range (``range=<shard>-<start>-<end>``): the layout the example wrote first.

Spark writes a run's rows under a column naming each row's range, in dynamic partition-overwrite mode, so a
range written again with the same bounds replaces its own folder and nothing else: a retry, a relaunch or a
backfill of exactly that range is idempotent. What it is not:

- replaced by coordinates: a range run again with other bounds (a shard handed over while its old run was still
  writing, a backfill of ``[0, 500)`` over committed ``[0, 300)`` and ``[300, 600)``) writes a folder of its own
  beside the old ones, and the records they share are then held twice. Backfills must align with the committed
  ranges (``replaces_by_coordinates`` is false).
- a table readers filter: the table is partitioned by range, one folder and a few small files per range, forever,
  and rows cannot be laid out by date or key. Readers that aggregate must sum per-range partials.

It needs no table format, and Spark's executors write it directly (the rows never pass through the run's process).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, field_validator

from dagster_streamgroup.sinks.base import RangeSink, SinkResult, SinkRun, Stopwatch
from dagster_streamgroup.sinks.coordinates import ShardRange, check_ranges

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

RANGE_COLUMN = "range"


def range_key(shard: str, start: int, end: int) -> str:
    """``<shard>-<start>-<end>``, the offsets zero-padded so keys sort in offset order; safe as a directory name
    (``topic:partition`` becomes ``topic-partition``)."""
    return f"{shard.replace(':', '-').replace('/', '-')}-{start:012d}-{end:012d}"


def with_range_column(df: DataFrame, ranges: Sequence[ShardRange], name: str = RANGE_COLUMN) -> DataFrame:
    """``df`` with a column naming each row's range (``range_key``), from the rows' shard (Kafka's ``topic``
    and ``partition``, v3io's ``shard``) and, where a shard has several ranges (a backfill re-processes many of a
    shard's ranges in one read), its offset: write with ``partitionBy(name)`` and ``partitionOverwriteMode=dynamic``
    to keep every range's output."""
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

    kafka = "topic" in df.columns
    shard = F.concat_ws(":", "topic", "partition") if kafka else F.col("shard").cast("string")
    offset = F.col("offset" if kafka else "sequence_number")
    by_shard: dict[str, list[ShardRange]] = {}
    for r in ranges:
        by_shard.setdefault(r.shard, []).append(r)
    key = F.lit(None).cast("string")
    for shard_id, of_shard in by_shard.items():
        in_shard = _by_offset(offset, sorted(of_shard, key=lambda r: r.start))
        key = F.when(shard == F.lit(shard_id), in_shard).otherwise(key)
    return df.withColumn(name, key)


def _by_offset(offset: Column, ranges: Sequence[ShardRange]) -> Column:
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


def write_range_folders(df: DataFrame, output: str | Path, range_column: str = RANGE_COLUMN) -> None:
    """Write ``df`` (with its range column) under ``output``, one ``<range_column>=<key>`` folder per range, in
    dynamic partition-overwrite mode: a range written again replaces its own folder and nothing else."""
    (
        df.write.mode("overwrite")
        .option("partitionOverwriteMode", "dynamic")
        .partitionBy(range_column)
        .parquet(str(output))
    )


class RangeFolderSink(RangeSink):
    """Parquet under ``path``, one folder per offset range, replaced when the same range is written again."""

    kind: Literal["parquet_ranges"] = "parquet_ranges"
    replaces_by_coordinates: ClassVar[bool] = False

    path: str = Field(description="The folder (a local path, made absolute, or a URI Spark writes to).")
    range_column: str = Field(default=RANGE_COLUMN, description="The partition column naming each row's range.")

    @field_validator("path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        value = value.strip()
        if not value:
            raise ValueError("path: must name a folder")
        # A {{ }} template (a Component's YAML, rendered later) is made absolute once rendered.
        if "://" in value or "{{" in value:
            return value
        return str(Path(value).expanduser().resolve())

    def target(self) -> str:
        return self.path

    def write(self, df: Any, ranges: Sequence[ShardRange], run: SinkRun | None = None) -> SinkResult:
        """``df`` is a Spark DataFrame with the source's shard columns (``topic``/``partition`` or ``shard``), or
        already with ``range_column``."""
        clock = Stopwatch()
        check_ranges(ranges)
        keyed = df if self.range_column in df.columns else with_range_column(df, ranges, self.range_column)
        write_range_folders(keyed, self.path, self.range_column)
        return SinkResult(kind=self.kind, target=self.path, rows=None, ranges=len(ranges), seconds=clock.seconds)
