"""Test instrumentation: where was each Spark partition of a read really read?

``install(spark, directory)`` registers, under the project's own format names (``streamgroup-kafka``,
``streamgroup-v3io``), subclasses of the project's data sources whose readers write one JSON record per partition
they read: the PID of the Python worker, the JVM it descends from (an executor's or the driver's, told apart by
the executor's command line), Spark's partition id, the ranges and the rows. The project's read functions
(``read_kafka_ranges``, ``read_kafka_range``, ``read_v3io_ranges``) then run unchanged, and the test reads the
records back. Executors import modules by name and this one is not installed there, so it is registered with
cloudpickle to travel by value (functions and classes pickled with the data source). The records are files, so
the executors and the test must share a filesystem: true on one machine, which is all this is for.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark import TaskContext
from pyspark.cloudpickle import register_pickle_by_value
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from dagster_streamgroup.local.spark_cluster import executor_of
from dagster_streamgroup.spark import kafka_source, v3io_source
from dagster_streamgroup.spark.reader import RangePartition

DRIVER = "driver"


@dataclass(frozen=True)
class ReadRecord:
    """One partition read: in which processes, what, and how many rows."""

    pid: int
    jvm_pid: int
    executor_id: str
    partition_id: int
    ranges: tuple[tuple[str, int, int], ...]
    rows: int


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def jvm_ancestor(pid: int) -> tuple[int, str]:
    """The nearest ``java`` ancestor of ``pid`` and its executor id (``"driver"`` when it is not an executor)."""
    current = pid
    while current > 1:
        cmdline = Path(f"/proc/{current}/cmdline").read_bytes().split(b"\0")[:-1]
        if cmdline and os.path.basename(cmdline[0]) == b"java":
            executor = executor_of(cmdline)
            return current, executor[0] if executor is not None else DRIVER
        current = _parent(current)
    raise RuntimeError(f"process {pid} has no java ancestor")


class RecordingReader(DataSourceReader):
    """Delegates to the project's reader; writes a ``ReadRecord`` after each partition it read."""

    def __init__(self, inner: DataSourceReader, directory: str) -> None:
        self.inner = inner
        self.directory = directory

    def partitions(self) -> Sequence[InputPartition]:
        return self.inner.partitions()

    def read(self, partition: InputPartition) -> Iterator[Any]:
        rows = 0
        for batch in self.inner.read(partition):
            rows += batch.num_rows
            yield batch
        jvm_pid, executor_id = jvm_ancestor(os.getpid())
        context = TaskContext.get()
        assert isinstance(partition, RangePartition)
        record = {
            "pid": os.getpid(),
            "jvm_pid": jvm_pid,
            "executor_id": executor_id,
            "partition_id": context.partitionId() if context is not None else -1,
            "ranges": [(r.shard, r.start, r.end) for r in partition.ranges],
            "rows": rows,
        }
        path = Path(self.directory) / f"{uuid.uuid4().hex}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        tmp.rename(path)


def recording(base: type[DataSource], directory: Path) -> type[DataSource]:
    """``base`` (same name and schema) whose readers record where they ran into ``directory``."""
    where = str(directory)

    def reader(self: DataSource, schema: StructType) -> DataSourceReader:
        return RecordingReader(base.reader(self, schema), where)

    return type(f"Recording{base.__name__}", (base,), {"reader": reader})


def install(spark: SparkSession, directory: Path) -> None:
    """Replace the project's registrations in ``spark`` by recording ones (the project's first, so its
    ``register`` sees the session as done and does not register over ours)."""
    register_pickle_by_value(sys.modules[__name__])
    directory.mkdir(parents=True, exist_ok=True)
    kafka_source.register(spark)
    v3io_source.register(spark)
    spark.dataSource.register(recording(kafka_source.KafkaRangeDataSource, directory))
    spark.dataSource.register(recording(v3io_source.V3ioRangeDataSource, directory))


def records(directory: Path) -> list[ReadRecord]:
    """The records written so far, then removed (the next read starts from none)."""
    out = []
    for path in sorted(directory.glob("*.json")):
        raw = json.loads(path.read_text())
        raw["ranges"] = tuple(tuple(r) for r in raw["ranges"])
        out.append(ReadRecord(**raw))
        path.unlink()
    return out
