"""Protobuf and JSON Schema records (written by confluent-kafka's own serializers through the real registry),
plain JSON and strings, and a v3io stream whose records carry the Confluent framing, read back as typed rows."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
import v3io.dataplane

from dagster_streamgroup.dagster import StreamSparkResource, V3ioStreamGroup
from dagster_streamgroup.formats.config import RegistryConfig
from dagster_streamgroup.formats.registry import SchemaSource
from dagster_streamgroup.local.v3io.testing import V3ioServerInfo
from tests.dagster.helpers import group_name
from tests.fixtures.kafka import TopicFactory
from tests.fixtures.v3io import unique_v3io_name
from tests.integration.formats.helpers import (
    CLICK_V2,
    avro_values,
    json_schema_values,
    produce,
    proto_class,
    protobuf_values,
)
from tests.integration.formats.test_typed_records import typed_resource, v2_of

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


@pytest.fixture(scope="module")
def spark() -> StreamSparkResource:
    return StreamSparkResource(master="local[1]")


def rows_of(resource: Any, spark: StreamSparkResource, ranges: dict[str, tuple[int, int]]) -> list[dict[str, Any]]:
    df = resource.read_ranges(spark.spark_session, ranges)
    return sorted((r.asDict(recursive=True) for r in df.collect()), key=lambda r: r.get("offset", 0))


def test_protobuf_records_of_two_versions_decode_into_the_latest_message(
    kafka_bootstrap: str, kafka_topics: TopicFactory, registry_url: str, tmp_path: Path, spark: StreamSparkResource
) -> None:
    topic = kafka_topics(partitions=1)
    v1 = proto_class("shop.v1", "Order", [("id", 1, "int64"), ("item", 2, "string")])
    v2 = proto_class("shop.v1", "Order", [("id", 1, "int64"), ("item", 2, "string"), ("price", 3, "double")])
    first = protobuf_values(registry_url, topic, v1, [{"id": 1, "item": "a"}])
    second = protobuf_values(registry_url, topic, v2, [{"id": 2, "item": "b", "price": 2.5}])
    produce(kafka_bootstrap, topic, [first[0], second[0]])
    resource = typed_resource(
        kafka_bootstrap, topic, group_name(), tmp_path, registry_url, value_format="protobuf", on_decode_error="null"
    )
    rows = rows_of(resource, spark, {f"{topic}:0": (0, 2)})
    assert [r["value"] for r in rows] == [{"id": 1, "item": "a", "price": 0.0}, {"id": 2, "item": "b", "price": 2.5}]
    assert [r["decodeError"] for r in rows] == [None, None]
    assert rows[0]["valueSchemaId"] != rows[1]["valueSchemaId"]


def test_json_schema_records_decode_and_a_value_of_another_type_is_a_decode_error(
    kafka_bootstrap: str, kafka_topics: TopicFactory, registry_url: str, tmp_path: Path, spark: StreamSparkResource
) -> None:
    topic = kafka_topics(partitions=1)
    schema = {
        "type": "object",
        "title": "Visit",
        "properties": {
            "id": {"type": "integer"},
            "page": {"type": "string"},
            "at": {"type": "string", "format": "date-time"},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
    }
    values = json_schema_values(
        registry_url, topic, schema, [{"id": 1, "page": "/a", "at": "2026-01-02T03:04:05Z", "tags": ["x"]}]
    )
    wrong = values[0][:5] + json.dumps({"id": "one", "page": "/b"}).encode()
    produce(kafka_bootstrap, topic, [values[0], wrong])
    resource = typed_resource(
        kafka_bootstrap, topic, group_name(), tmp_path, registry_url, value_format="json_schema", on_decode_error="null"
    )
    rows = rows_of(resource, spark, {f"{topic}:0": (0, 2)})
    assert rows[0]["value"] == {"id": 1, "page": "/a", "at": dt.datetime(2026, 1, 2, 3, 4, 5), "tags": ["x"]}
    assert rows[1]["value"] is None and "expected an integer" in rows[1]["decodeError"]


def test_plain_json_and_strings_need_no_registry(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path, spark: StreamSparkResource
) -> None:
    topic = kafka_topics(partitions=1)
    produce(kafka_bootstrap, topic, [b'{"n": 1, "s": "x"}', b"[1]"])
    schema = json.dumps({"type": "object", "properties": {"n": {"type": "integer"}, "s": {"type": "string"}}})
    from tests.dagster.helpers import group_resource

    resource = group_resource(
        kafka_bootstrap, topic, group_name(), tmp_path, value_format="json", value_json_schema=schema,
        key_format="string", on_decode_error="null",
    )  # fmt: skip
    rows = rows_of(resource, spark, {f"{topic}:0": (0, 2)})
    assert rows[0]["value"] == {"n": 1, "s": "x"} and rows[0]["key"] is None
    assert rows[1]["value"] is None and rows[1]["decodeError"].startswith("value: payload does not decode")


def test_a_v3io_stream_of_framed_records_reads_as_the_same_typed_rows(
    kafka_bootstrap: str,
    kafka_topics: TopicFactory,
    registry_url: str,
    tmp_path: Path,
    spark: StreamSparkResource,
    v3io_server: V3ioServerInfo,
) -> None:
    topic = kafka_topics(partitions=1)
    records = [
        {"id": i, "page": f"/v/{i}", "price": None, "at": dt.datetime(2026, 1, 1, tzinfo=dt.UTC), "kind": "BUY",
         "tags": []}
        for i in range(5)
    ]  # fmt: skip
    values = avro_values(registry_url, topic, CLICK_V2, records)
    produce(kafka_bootstrap, topic, values)
    kafka_rows = rows_of(
        typed_resource(kafka_bootstrap, topic, group_name(), tmp_path, registry_url), spark, {f"{topic}:0": (0, 5)}
    )

    # Subjects named after the record (the stream has no topic): the reader is the latest of `shop.Click`.
    SchemaSource(RegistryConfig(url=registry_url)).register("shop.Click", json.dumps(CLICK_V2))
    stream = unique_v3io_name("typed")
    client = v3io.dataplane.Client(**v3io_server.client_kwargs())
    try:
        client.stream.create("bigdata", stream, shard_count=1)
        out = client.stream.put_records("bigdata", stream, [{"shard_id": 0, "data": v} for v in values]).output
        assert out.failed_record_count == 0
    finally:
        client.close()
    resource = V3ioStreamGroup(
        group="typed",
        endpoint=v3io_server.endpoint,
        container="bigdata",
        stream_path=stream,
        access_key=v3io_server.access_key.get_secret_value(),
        value_format="avro",
        schema_registry_url=registry_url,
        subject_name_strategy="RecordNameStrategy",
        value_record_name="shop.Click",
    )
    df = resource.read_ranges(spark.spark_session, {"0": (1, 6)})
    v3io_rows = sorted((r.asDict(recursive=True) for r in df.collect()), key=lambda r: r["sequence_number"])
    assert [r["data"] for r in v3io_rows] == [r["value"] for r in kafka_rows] == [v2_of(r, 2) for r in records]
    assert [r["valueSchemaId"] for r in v3io_rows] == [r["valueSchemaId"] for r in kafka_rows]
