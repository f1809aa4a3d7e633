"""The ``streamgroup-v3io`` Spark source against the real server: the DataFrame equals the backend's read of
the same ranges row for row (also when ranges are split over partitions), errors name the option, and the
access key never shows in a plan."""

from __future__ import annotations

import contextlib
import io
from typing import Any

import pyarrow as pa
import pytest
from pydantic import SecretStr
from pyspark.sql import SparkSession
from pyspark.sql.pandas.types import to_arrow_schema

from dagster_streamgroup.local.v3io.testing import V3ioServerInfo
from dagster_streamgroup.spark.v3io_source import SPARK_V3IO_SCHEMA, read_v3io_ranges
from dagster_streamgroup.streams.v3io import V3IO_ARROW_SCHEMA, V3ioBackend
from dagster_streamgroup.streams.v3io_config import V3ioStreamConfig
from tests.fixtures.v3io import unique_v3io_name
from tests.integration.v3io.conftest import CONTAINER, put, stream_config

pytestmark = [pytest.mark.spark, pytest.mark.v3io]

Row = tuple[Any, ...]


@pytest.fixture(scope="module")
def data(v3io_server: V3ioServerInfo) -> Any:
    import v3io.dataplane

    path = unique_v3io_name("spark")
    client = v3io.dataplane.Client(**v3io_server.client_kwargs())
    try:
        client.stream.create(CONTAINER, path, shard_count=3)
        for shard, n in ((0, 3000), (1, 1200)):
            for chunk in range(0, n, 1000):
                put(client, path, shard, [f"s{shard}-{i}".encode() for i in range(chunk, min(n, chunk + 1000))])
        put(client, path, 2, [b"k1", b"k2"], partition_key="pk", client_info=b"ci")
    finally:
        client.close()
    return stream_config(v3io_server, path)


def _backend_rows(config: V3ioStreamConfig, ranges: dict[str, tuple[int, int]]) -> list[Row]:
    backend = V3ioBackend(config)
    try:
        rows: list[Row] = []
        for shard, (start, end) in ranges.items():
            table = pa.Table.from_batches(list(backend.read_range(shard, start, end)), V3IO_ARROW_SCHEMA)
            rows.extend(_epoch_us(tuple(r.values())) for r in table.to_pylist())
        return sorted(rows, key=lambda r: (r[0], r[1]))
    finally:
        backend.close()


def _epoch_us(row: Row) -> Row:
    """Arrival time as epoch microseconds: Spark hands back naive local datetimes, Arrow aware UTC ones."""
    return (*row[:3], round(row[3].timestamp() * 1_000_000), *row[4:])


def _spark_rows(rows: list[Any]) -> list[Row]:
    return sorted((_epoch_us(tuple(r)) for r in rows), key=lambda r: (r[0], r[1]))


def test_the_schemas_agree() -> None:
    assert to_arrow_schema(SPARK_V3IO_SCHEMA, timezone="UTC").equals(V3IO_ARROW_SCHEMA)


@pytest.mark.parametrize("split", [None, 700], ids=["one-partition-per-shard", "split"])
def test_dataframe_equals_the_backend_read_row_for_row(
    spark: SparkSession, data: V3ioStreamConfig, split: int | None
) -> None:
    ranges = {"0": (5, 2999), "1": (1, 1201), "2": (1, 3)}
    df = read_v3io_ranges(spark, data, ranges, max_records_per_partition=split, batch_size=400)
    if split is not None:
        assert df.rdd.getNumPartitions() == 5 + 2 + 1
    expected = _backend_rows(data, ranges)
    assert len(expected) == 2994 + 1200 + 2
    assert _spark_rows(df.collect()) == expected
    assert df.schema == SPARK_V3IO_SCHEMA


def test_a_range_past_the_data_fails_the_query(spark: SparkSession, data: V3ioStreamConfig) -> None:
    with pytest.raises(Exception, match="could not be completed"):
        read_v3io_ranges(spark, data, {"2": (1, 10)}, stall_timeout_s=0.5).collect()


def test_bad_options_fail_with_the_option_named(spark: SparkSession, data: V3ioStreamConfig) -> None:
    with pytest.raises(ValueError, match="not a v3io shard id"):
        read_v3io_ranges(spark, data, {"a": (1, 3)})

    def reader() -> Any:
        return spark.read.format("streamgroup-v3io").option("ranges", '[{"shard": "0", "start": 1, "end": 3}]')

    with pytest.raises(Exception, match=r"option 'v3io\.endpoint' is required"):
        reader().load().count()
    with pytest.raises(Exception, match=r"option v3io\.container: .*container name"):
        reader().options(**{"v3io.endpoint": data.endpoint, "v3io.container": "no/such",
                            "v3io.stream_path": "x"}).load().count()  # fmt: skip


def test_the_access_key_is_not_in_query_plans(spark: SparkSession) -> None:
    secret = "v3io-Acc3ss-k3y-value"
    config = V3ioStreamConfig(
        endpoint="127.0.0.1:9", container="bigdata", stream_path="s", access_key=SecretStr(secret)
    )
    df = read_v3io_ranges(spark, config, {"0": (1, 10)})
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        df.explain(mode="extended")
        df.explain(mode="formatted")
    assert "streamgroup-v3io" in out.getvalue()
    assert secret not in out.getvalue()
