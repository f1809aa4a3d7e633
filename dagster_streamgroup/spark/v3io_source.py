"""``spark.read.format("streamgroup-v3io")``: exact sequence-number ranges of a v3io stream as a DataFrame.

Columns: ``shard``, ``sequence_number``, ``data``, ``arrival_time``, ``partition_key``, ``client_info`` (the
backend's ``V3IO_ARROW_SCHEMA``), read by the ``v3io`` client inside the Spark tasks with Seek SEQUENCE +
GetRecords and handed to Spark as Arrow batches. Options:

- ``ranges`` (required): JSON list of ``{"shard": "<shard id>", "start": s, "end": e}`` (sequence numbers,
  ``end`` exclusive);
- ``v3io.endpoint``, ``v3io.container``, ``v3io.stream_path`` (required);
- ``v3io.access.key`` or ``v3io.access.key.file`` (else ``$V3IO_ACCESS_KEY`` on the executors). The option
  name matches Spark's ``spark.redaction.regex`` (``access[.]?key``), so plans show it redacted; a key
  file keeps the key out of the options altogether;
- ``minPartitions``, ``maxRecordsPerPartition``: split large ranges over more tasks; ``minRecordsPerPartition``:
  ranges smaller than this share a task until it holds this many records;
- ``batchSize`` (records per Arrow batch, 10000), ``recordsPerRequest`` (GetRecords limit, 1000),
  ``stallTimeoutSeconds`` (30): give up on a range after this long without progress;
- ``formats``, ``readers``, ``writerSchemas`` (``formats.spark.decode_options``): typed records: ``data`` decoded
  into the reader schema's columns, with ``valueSchemaId`` and ``decodeError``.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
from pydantic import SecretStr, ValidationError
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader
from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType, TimestampType

from dagster_streamgroup.spark.ranges import ShardRange, as_shard_ranges, ranges_to_json
from dagster_streamgroup.spark.reader import RangeReader, float_option, int_option
from dagster_streamgroup.streams.v3io import V3ioStream, parse_shard, read_shard_range
from dagster_streamgroup.streams.v3io_config import V3ioStreamConfig

FORMAT = "streamgroup-v3io"
ENDPOINT = "v3io.endpoint"
CONTAINER = "v3io.container"
STREAM_PATH = "v3io.stream_path"
ACCESS_KEY = "v3io.access.key"
ACCESS_KEY_FILE = "v3io.access.key.file"

SPARK_V3IO_SCHEMA = StructType(
    [
        StructField("shard", IntegerType(), nullable=False),
        StructField("sequence_number", LongType(), nullable=False),
        StructField("data", BinaryType(), nullable=False),
        StructField("arrival_time", TimestampType(), nullable=False),
        StructField("partition_key", StringType()),
        StructField("client_info", BinaryType()),
    ]
)
"""The Spark twin of ``V3IO_ARROW_SCHEMA`` (same names, types and nullability)."""


def config_from_options(options: Mapping[str, str]) -> V3ioStreamConfig:
    """The stream configuration the options describe; errors name the option, never the key."""
    values: dict[str, Any] = {}
    for option, field in ((ENDPOINT, "endpoint"), (CONTAINER, "container"), (STREAM_PATH, "stream_path")):
        value = options.get(option)
        if value is None:
            raise ValueError(f"option {option!r} is required")
        values[field] = value
    if options.get(ACCESS_KEY) is not None:
        values["access_key"] = SecretStr(options[ACCESS_KEY])
    if options.get(ACCESS_KEY_FILE) is not None:
        values["access_key_file"] = Path(options[ACCESS_KEY_FILE])
    per_request = int_option(options, "recordsPerRequest", None)
    if per_request is not None:
        values["records_per_request"] = per_request
    try:
        return V3ioStreamConfig(**values)
    except ValidationError as exc:
        names = {
            "access_key": ACCESS_KEY,
            "access_key_file": ACCESS_KEY_FILE,
            "records_per_request": "recordsPerRequest",
        }
        detail = "; ".join(
            f"option {names.get(str(e['loc'][0]), 'v3io.' + str(e['loc'][0])) if e['loc'] else 'v3io'}: {e['msg']}"
            for e in exc.errors(include_input=False, include_url=False)
        )
        raise ValueError(detail) from None


class V3ioRangeReader(RangeReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        super().__init__(options)
        self.config = config_from_options(options)
        self.stall_timeout_s = float_option(options, "stallTimeoutSeconds", 30.0)
        for r in self.ranges:
            parse_shard(r.shard)
        self.options = dict(options)

    def read_ranges(self, ranges: Sequence[ShardRange]) -> Iterator[pa.RecordBatch]:
        if "formats" not in self.options:
            return self._read_raw(ranges)
        from dagster_streamgroup.formats.spark import decode_batches, decoder_from_options, keeps_raw

        decoder = decoder_from_options(self.options, value_column="data", key_column=None)
        assert decoder is not None
        return decode_batches(decoder, self._read_raw(ranges), keep_raw=keeps_raw(self.options))

    def _read_raw(self, ranges: Sequence[ShardRange]) -> Iterator[pa.RecordBatch]:
        stream = V3ioStream(self.config)
        try:
            for r in ranges:
                yield from read_shard_range(
                    stream,
                    parse_shard(r.shard),
                    r.start,
                    r.end,
                    batch_size=self.batch_size,
                    records_per_request=self.config.records_per_request,
                    stall_timeout_s=self.stall_timeout_s,
                )
        finally:
            stream.close()


class V3ioRangeDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        if "formats" not in self.options:
            return SPARK_V3IO_SCHEMA
        from dagster_streamgroup.formats.spark import decoder_from_options, keeps_raw, spark_schema, typed_arrow_schema
        from dagster_streamgroup.streams.v3io import V3IO_ARROW_SCHEMA

        decoder = decoder_from_options(self.options, value_column="data", key_column=None)
        assert decoder is not None
        return spark_schema(typed_arrow_schema(decoder, V3IO_ARROW_SCHEMA, keep_raw=keeps_raw(self.options)))

    def reader(self, schema: StructType) -> DataSourceReader:
        return V3ioRangeReader(self.options)


_registered: weakref.WeakSet[SparkSession] = weakref.WeakSet()


def register(spark: SparkSession) -> None:
    """Register the source with a session (once: registration costs about a second)."""
    if spark in _registered:
        return
    spark.dataSource.register(V3ioRangeDataSource)
    _registered.add(spark)


def spark_options(config: V3ioStreamConfig) -> dict[str, str]:
    """``v3io.``-prefixed options for the stream; the key travels as a file path when it came from one."""
    options = {
        ENDPOINT: config.endpoint,
        CONTAINER: config.container,
        STREAM_PATH: config.stream_path,
        "recordsPerRequest": str(config.records_per_request),
    }
    if config.access_key_file is not None:
        options[ACCESS_KEY_FILE] = str(config.access_key_file)
    else:
        options[ACCESS_KEY] = config.resolve_access_key()
    return options


def read_v3io_ranges(
    spark: SparkSession,
    config: V3ioStreamConfig,
    ranges: Mapping[str, tuple[int, int]] | Sequence[ShardRange],
    *,
    min_partitions: int | None = None,
    max_records_per_partition: int | None = None,
    min_records_per_partition: int | None = None,
    batch_size: int | None = None,
    stall_timeout_s: float | None = None,
    decode: Mapping[str, str] | None = None,
) -> DataFrame:
    """A DataFrame of exactly the records of ``ranges`` (``{"<shard>": (start, end)}`` or ShardRanges); typed
    when ``decode`` holds a run's formats (``formats.spark.decode_options``)."""
    register(spark)
    shard_ranges = as_shard_ranges(ranges)
    for r in shard_ranges:
        parse_shard(r.shard)
    options = {"ranges": ranges_to_json(shard_ranges), **spark_options(config), **(decode or {})}
    for name, value in (
        ("minPartitions", min_partitions),
        ("maxRecordsPerPartition", max_records_per_partition),
        ("minRecordsPerPartition", min_records_per_partition),
        ("batchSize", batch_size),
        ("stallTimeoutSeconds", stall_timeout_s),
    ):
        if value is not None:
            options[name] = str(value)
    return spark.read.format(FORMAT).options(**options).load()
