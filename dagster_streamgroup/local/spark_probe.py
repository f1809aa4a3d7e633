"""A trivial Python Data Source that yields ``rows`` rows as one Arrow batch.

It exercises exactly the machinery a stream read pays for on a Spark Connect server (pickling the source,
the planner and data-source Python workers, an Arrow batch crossing into the JVM) without any broker, so
the server's warm-up job and the per-run overhead benchmark measure Spark alone. It lives in the installed
package because server-side Python workers import it by reference.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import LongType, StringType, StructField, StructType

NAME = "streamgroup_probe"
DEFAULT_ROWS = 1000
_SCHEMA = StructType([StructField("offset", LongType(), nullable=False), StructField("value", StringType())])
_ARROW_SCHEMA = pa.schema([pa.field("offset", pa.int64(), nullable=False), pa.field("value", pa.string())])


def _rows_option(options: dict[str, str]) -> int:
    raw = options.get("rows", str(DEFAULT_ROWS))
    try:
        rows = int(raw)
    except ValueError:
        raise ValueError(f"option 'rows' must be a non-negative integer, got {raw!r}") from None
    if rows < 0:
        raise ValueError(f"option 'rows' must be a non-negative integer, got {rows}")
    return rows


class _ProbeReader(DataSourceReader):
    def __init__(self, rows: int) -> None:
        self._rows = rows

    def partitions(self) -> Sequence[InputPartition]:
        return [InputPartition(0)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        offsets = pa.array(range(self._rows), type=pa.int64())
        values = pa.array(["x" * 100] * self._rows, type=pa.string())
        yield pa.RecordBatch.from_arrays([offsets, values], schema=_ARROW_SCHEMA)


class ProbeDataSource(DataSource):
    """``spark.read.format("streamgroup_probe").option("rows", 1000).load()``: ``offset`` 0..rows-1 and a
    100-character ``value``."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return _SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return _ProbeReader(_rows_option(dict(self.options)))


def _read(spark: SparkSession, rows: int, kafka: tuple[str, str] | None) -> int:
    if kafka is None:
        spark.dataSource.register(ProbeDataSource)
        return int(spark.read.format(NAME).option("rows", rows).load().count())
    from dagster_streamgroup.spark.kafka_source import read_kafka_ranges
    from dagster_streamgroup.streams.kafka_config import KafkaStreamConfig

    bootstrap, topic = kafka
    config = KafkaStreamConfig(bootstrap_servers=bootstrap, topics=[topic])
    return int(read_kafka_ranges(spark, config, {f"{topic}:0": (0, rows)}).count())


def probe_run(
    *,
    remote: str | None = None,
    master: str | None = None,
    rows: int = DEFAULT_ROWS,
    kafka: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """What one Dagster run pays before its own work starts: a session (Connect ``remote`` or classic
    ``master``) and the first read of ``rows`` rows through a Python Data Source (this probe, or with
    ``kafka=(bootstrap, topic)`` the project's Kafka source over partition 0's offsets [0, rows)). Returns
    seconds per step and the row count read; ``overhead_s`` is session + first read (registration included)."""
    if (remote is None) == (master is None):
        raise ValueError("give exactly one of remote (sc://host:port) or master (e.g. local[2])")
    if master is not None:
        # Classic mode starts its own Python workers; they must import this package and pyarrow.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    started = time.perf_counter()
    if remote is not None:
        spark = SparkSession.builder.remote(remote).getOrCreate()
    else:
        spark = (
            SparkSession.builder.master(master or "local[2]")
            .config("spark.ui.enabled", "false")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.log.level", "WARN")
            .getOrCreate()
        )
    session_done = time.perf_counter()
    count = _read(spark, rows, kafka)
    read_done = time.perf_counter()
    spark.stop()
    stopped = time.perf_counter()
    return {
        "mode": "connect" if remote is not None else "local",
        "source": "kafka" if kafka is not None else NAME,
        "rows": count,
        "session_s": round(session_done - started, 3),
        "first_read_s": round(read_done - session_done, 3),
        "overhead_s": round(read_done - started, 3),
        "stop_s": round(stopped - read_done, 3),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m dagster_streamgroup.local.spark_probe (--remote sc://... | --master local[2])
    [--kafka-bootstrap B --kafka-topic T]``: one probe run in this process; prints its timings as one JSON line
    (used for warm-up, the benchmark and tests)."""
    begun = time.perf_counter()
    parser = argparse.ArgumentParser(description="One probe run: session + first Python Data Source read.")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--remote")
    target.add_argument("--master")
    parser.add_argument("--rows", type=int, default=DEFAULT_ROWS)
    parser.add_argument("--kafka-bootstrap", help="read partition 0 of --kafka-topic through the Kafka source")
    parser.add_argument("--kafka-topic")
    args = parser.parse_args(argv)
    if (args.kafka_bootstrap is None) != (args.kafka_topic is None):
        parser.error("--kafka-bootstrap and --kafka-topic go together")
    kafka = (args.kafka_bootstrap, args.kafka_topic) if args.kafka_bootstrap else None
    result = probe_run(remote=args.remote, master=args.master, rows=args.rows, kafka=kafka)
    if result["rows"] != args.rows:
        print(json.dumps({**result, "error": f"read {result['rows']} rows, expected {args.rows}"}), flush=True)
        return 1
    result["process_s"] = round(time.perf_counter() - begun, 3)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
