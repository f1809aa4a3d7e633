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
    from pyspark.sql import DataFrame

RANGE_COLUMN = "range"


def range_key(shard: str, start: int, end: int) -> str:
    """``<shard>-<start>-<end>``, the offsets zero-padded so keys sort in offset order; safe as a directory name
    (``topic:partition`` becomes ``topic-partition``)."""
    return f"{shard.replace(':', '-').replace('/', '-')}-{start:012d}-{end:012d}"


def with_range_column(df: DataFrame, ranges: Sequence[ShardRange], name: str = RANGE_COLUMN) -> DataFrame:
    """``df`` with a column naming each row's range (``range_key``), from the rows' shard (Kafka's ``topic``
    and ``partition``, v3io's ``shard``): write with ``partitionBy(name)`` and
    ``partitionOverwriteMode=dynamic`` to keep every range's output."""
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

    shard = F.concat_ws(":", "topic", "partition") if "topic" in df.columns else F.col("shard").cast("string")
    key = F.lit(None).cast("string")
    for r in ranges:
        key = F.when(shard == F.lit(r.shard), F.lit(range_key(r.shard, r.start, r.end))).otherwise(key)
    return df.withColumn(name, key)


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
