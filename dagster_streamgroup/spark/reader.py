"""A data source reader over planned shard ranges, shared by every stream's Spark source.

A concrete source supplies how to read a list of ranges as Arrow batches; planning, option parsing and the
exact-schema contract live here once."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from dagster_streamgroup.spark.ranges import ShardRange, pack_partitions, plan_partitions, ranges_from_json


@dataclass
class RangePartition(InputPartition):
    """The shard ranges one Spark task reads (pickled to the executors)."""

    ranges: tuple[ShardRange, ...]


def int_option(options: Mapping[str, str], name: str, default: int | None) -> int | None:
    """Read an integer option; Spark hands options over with lower-cased keys."""
    raw = options.get(name.lower())
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"option {name!r} must be an integer, got {raw!r}") from None


def float_option(options: Mapping[str, str], name: str, default: float) -> float:
    raw = options.get(name.lower())
    if raw is None:
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"option {name!r} must be a number, got {raw!r}") from None


class RangeReader(DataSourceReader):
    """Plans input partitions from the ``ranges`` option and yields what ``read_ranges`` returns."""

    def __init__(self, options: Mapping[str, str]) -> None:
        text = options.get("ranges")
        if text is None:
            raise ValueError("option 'ranges' is required: a JSON list of {shard, start, end}")
        self.ranges = ranges_from_json(text)
        self.min_partitions = int_option(options, "minPartitions", None)
        self.max_records_per_partition = int_option(options, "maxRecordsPerPartition", None)
        self.min_records_per_partition = int_option(options, "minRecordsPerPartition", None)
        self.batch_size = int_option(options, "batchSize", 10_000) or 10_000
        if self.batch_size < 1:
            raise ValueError(f"option 'batchSize' must be >= 1, got {self.batch_size}")
        pack_partitions(  # fail at planning time, in the driver, on bad ranges or sizes
            plan_partitions(
                self.ranges,
                min_partitions=self.min_partitions,
                max_records_per_partition=self.max_records_per_partition,
            ),
            self.min_records_per_partition,
        )

    def partitions(self) -> Sequence[InputPartition]:
        planned = plan_partitions(
            self.ranges, min_partitions=self.min_partitions, max_records_per_partition=self.max_records_per_partition
        )
        if not planned:  # Spark needs at least one partition; an empty one yields nothing
            return [RangePartition(())]
        return [RangePartition(ranges) for ranges in pack_partitions(planned, self.min_records_per_partition)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        if partition.ranges:
            yield from self.read_ranges(partition.ranges)

    def read_ranges(self, ranges: Sequence[ShardRange]) -> Iterator[pa.RecordBatch]:
        raise NotImplementedError
