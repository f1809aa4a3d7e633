"""Odd records: empty, null key or value, bytes that are not UTF-8, a thousand headers, a record larger than
the fetch limits and one larger than the client may receive, and a librdkafka property the client refuses.

Each range is planned by a member and read by the backend the Spark source uses (and, for Kafka, by Spark):
the rows are exactly the records, byte for byte, with nulls kept apart from empty values; a range that cannot
be read fails by name and is retried with the same offsets, and nothing is committed past it.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # listed, not re-exported, by the package
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)
from pyspark.sql import SparkSession
from sqlalchemy.engine import make_url

from dagster_streamgroup.local.kafka_data import produce_records
from dagster_streamgroup.local.v3io.testing import V3ioServerInfo
from dagster_streamgroup.member import GroupMember
from dagster_streamgroup.protocol import FailOutcome, Launch, report_of
from dagster_streamgroup.spark.kafka_source import read_kafka_ranges
from dagster_streamgroup.stores.sql import SqlStateStore
from dagster_streamgroup.streams.base import RangeIncompleteError, StreamBackend, StreamError
from dagster_streamgroup.streams.kafka import KAFKA_ARROW_SCHEMA
from dagster_streamgroup.streams.kafka_config import KafkaStreamConfig
from tests.fixtures.kafka import TopicFactory, unique_name
from tests.integration.v3io.conftest import CONTAINER, NewStream
from tests.reliability.conftest import kafka_backend, member_of

NOT_UTF8 = b"\xff\xfe\x00\xc3\x28 not text"


def _one_range(member: GroupMember) -> Launch:
    [launch] = member.tick().new_launches
    return launch


def _read(backend: StreamBackend, launch: Launch, **kwargs: Any) -> pa.Table:
    return pa.Table.from_batches(
        list(backend.read_range(launch.shard, launch.start, launch.end, **kwargs)), backend.arrow_schema
    )


def _kafka(bootstrap: str, topics: TopicFactory, sqlite_url: str, **properties: str) -> tuple[GroupMember, str]:
    topic = topics(1)
    backend = kafka_backend(bootstrap, topic, **properties)
    return member_of(SqlStateStore(sqlite_url), backend, unique_name("g")), topic


@pytest.mark.kafka
def test_empty_and_null_keys_and_values_stay_apart(
    kafka_bootstrap: str, kafka_topics: TopicFactory, sqlite_url: str
) -> None:
    member, topic = _kafka(kafka_bootstrap, kafka_topics, sqlite_url)
    produce_records(
        kafka_bootstrap, topic, 0, [b"", None, b"", None, b"v"], keys=[b"", b"", None, None, b"k"]
    )  # an empty value, a tombstone, ...
    launch = _one_range(member)
    assert (launch.start, launch.end) == (0, 5)
    rows = _read(member.backend, launch).select(["key", "value", "offset"]).to_pylist()
    assert rows == [
        {"key": b"", "value": b"", "offset": 0},
        {"key": b"", "value": None, "offset": 1},
        {"key": None, "value": b"", "offset": 2},
        {"key": None, "value": None, "offset": 3},
        {"key": b"k", "value": b"v", "offset": 4},
    ]
    assert member.commit(report_of(launch)).committed == 5


@pytest.mark.kafka
def test_bytes_that_are_not_utf8_arrive_unchanged(
    kafka_bootstrap: str, kafka_topics: TopicFactory, sqlite_url: str
) -> None:
    member, topic = _kafka(kafka_bootstrap, kafka_topics, sqlite_url)
    produce_records(kafka_bootstrap, topic, 0, [NOT_UTF8, b"\x80"], keys=[NOT_UTF8[::-1], None],
                    headers=[[("trace", NOT_UTF8)], None])  # fmt: skip
    launch = _one_range(member)
    table = _read(member.backend, launch)
    assert table.column("value").to_pylist() == [NOT_UTF8, b"\x80"]
    assert table.column("key").to_pylist() == [NOT_UTF8[::-1], None]
    assert table.column("headers").to_pylist()[0] == [{"key": "trace", "value": NOT_UTF8}]


@pytest.mark.kafka
def test_a_thousand_headers_with_repeated_keys_and_null_values_keep_their_order(
    kafka_bootstrap: str, kafka_topics: TopicFactory, sqlite_url: str
) -> None:
    member, topic = _kafka(kafka_bootstrap, kafka_topics, sqlite_url)
    headers: list[tuple[str, bytes | None]] = [
        (f"h{i % 7}", None if i % 10 == 0 else i.to_bytes(2, "big")) for i in range(1000)
    ]
    produce_records(kafka_bootstrap, topic, 0, [b"many", b"none"], headers=[headers, None])
    launch = _one_range(member)
    got = _read(member.backend, launch).column("headers").to_pylist()
    assert got[0] == [{"key": k, "value": v} for k, v in headers]
    assert got[1] is None


def _large_record(bootstrap: str, topic: str, size: int) -> None:
    """A record of ``size`` bytes; the topic is made to take it (Kafka refuses batches over ``max.message.bytes``,
    about 1 MB by default)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    allow = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("max.message.bytes", str(size + 100_000), incremental_operation=AlterConfigOpType.SET)
    ])  # fmt: skip
    for future in admin.incremental_alter_configs([allow]).values():
        future.result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "message.max.bytes": size + 10_000})
    producer.produce(topic, b"L" * size, key=b"large", partition=0)
    assert producer.flush(30) == 0


@pytest.mark.kafka
def test_a_record_larger_than_the_fetch_limits_is_read_whole(
    kafka_bootstrap: str, kafka_topics: TopicFactory, sqlite_url: str
) -> None:
    """fetch.max.bytes and max.partition.fetch.bytes are soft limits: the broker returns a first record larger
    than them whole (KIP-74), so a range never stalls on one."""
    limits = {"fetch.max.bytes": "100000", "max.partition.fetch.bytes": "100000", "message.max.bytes": "100000"}
    member, topic = _kafka(kafka_bootstrap, kafka_topics, sqlite_url, **limits)
    produce_records(kafka_bootstrap, topic, 0, [b"before"])
    _large_record(kafka_bootstrap, topic, 2_000_000)
    produce_records(kafka_bootstrap, topic, 0, [b"after"])
    launch = _one_range(member)
    values = _read(member.backend, launch).column("value").to_pylist()
    assert [len(v) for v in values] == [6, 2_000_000, 5]


@pytest.mark.kafka
def test_a_record_larger_than_the_client_may_receive_fails_the_range_naming_the_setting(
    kafka_bootstrap: str, kafka_topics: TopicFactory, sqlite_url: str
) -> None:
    """A record above receive.message.max.bytes makes librdkafka drop the connection and retry forever. The read
    used to give up saying only "the broker sent neither records nor an end-of-partition"; now it quotes the
    client's own error, which names the setting to raise."""
    limits = {"fetch.max.bytes": "100000", "message.max.bytes": "100000", "receive.message.max.bytes": "200000"}
    member, topic = _kafka(kafka_bootstrap, kafka_topics, sqlite_url, **limits)
    _large_record(kafka_bootstrap, topic, 1_000_000)
    produce_records(kafka_bootstrap, topic, 0, [b"after"])
    launch = _one_range(member)
    with pytest.raises(RangeIncompleteError, match=r"increase receive\.message\.max\.bytes") as caught:
        _read(member.backend, launch)
    assert f"{topic}:0 [0, 2) read up to 0" in str(caught.value)
    assert member.fail(report_of(launch), str(caught.value)) == FailOutcome.RETRY
    [retry] = member.tick().new_launches
    assert (retry.start, retry.end, retry.attempt) == (0, 2, 1)
    fixed = kafka_backend(kafka_bootstrap, topic)  # the operator raises the limit
    assert _read(fixed, retry).num_rows == 2
    assert member.commit(report_of(retry)).committed == 2


@pytest.mark.kafka
def test_a_property_librdkafka_refuses_fails_the_tick_naming_properties(
    kafka_bootstrap: str, kafka_topics: TopicFactory, sqlite_url: str
) -> None:
    """Properties are passed to librdkafka untouched, so only it can check them: its refusal used to escape as
    a bare KafkaException ("Failed to create consumer ...")."""
    member, _ = _kafka(kafka_bootstrap, kafka_topics, sqlite_url, **{"fetch.max.bytes": "100", "no.such.setting": "1"})
    with pytest.raises(StreamError, match=r"properties: librdkafka refused the configuration: .*no\.such\.setting"):
        member.tick()
    with sqlite3.connect(str(make_url(sqlite_url).database)) as db:
        assert db.execute("SELECT count(*) FROM streamgroup_state").fetchone() == (0,), "a refused tick writes nothing"


@pytest.mark.kafka
@pytest.mark.slow
def test_odd_records_reach_spark_as_they_are(
    spark: SparkSession, kafka_bootstrap: str, kafka_topics: TopicFactory, sqlite_url: str
) -> None:
    member, topic = _kafka(kafka_bootstrap, kafka_topics, sqlite_url)
    produce_records(kafka_bootstrap, topic, 0, [b"", None, NOT_UTF8], keys=[None, b"", b"k"],
                    headers=[None, [("a", None), ("a", b"")], [("b", NOT_UTF8)]])  # fmt: skip
    launch = _one_range(member)
    config = KafkaStreamConfig(bootstrap_servers=kafka_bootstrap, topics=[topic])
    df = read_kafka_ranges(spark, config, {launch.shard: (launch.start, launch.end)})
    rows = [r.asDict(recursive=True) for r in df.orderBy("offset").collect()]
    expected = _read(member.backend, launch)
    assert [r["value"] for r in rows] == [
        None if v is None else bytearray(v) for v in expected.column("value").to_pylist()
    ]
    assert [r["key"] for r in rows] == [None, bytearray(b""), bytearray(b"k")]
    assert [r["headers"] for r in rows][1] == [{"key": "a", "value": None}, {"key": "a", "value": bytearray(b"")}]
    assert expected.schema == KAFKA_ARROW_SCHEMA


@pytest.mark.v3io
def test_v3io_records_with_empty_data_bytes_and_a_non_ascii_key_arrive_unchanged(
    v3io_server: V3ioServerInfo, new_stream: NewStream, v3io_client: Any, sqlite_url: str
) -> None:
    backend = new_stream(1)
    path = backend.config.stream_path
    records = [
        {"shard_id": 0, "data": b""},
        {"shard_id": 0, "data": NOT_UTF8, "partition_key": "clé-ü"},
        {"shard_id": 0, "data": b"x", "client_info": NOT_UTF8},
    ]
    assert v3io_client.stream.put_records(CONTAINER, path, records).output.failed_record_count == 0
    member = member_of(SqlStateStore(sqlite_url), backend, "cg")
    launch = _one_range(member)
    assert (launch.start, launch.end) == (1, 4)
    table = _read(backend, launch)
    assert table.column("data").to_pylist() == [b"", NOT_UTF8, b"x"]
    assert table.column("partition_key").to_pylist() == [None, "clé-ü", None]
    assert table.column("client_info").to_pylist() == [None, None, NOT_UTF8]
    assert member.commit(report_of(launch)).committed == 4
