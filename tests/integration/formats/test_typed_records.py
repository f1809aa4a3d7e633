"""Typed records against the real parts: the local Schema Registry (Apicurio Registry's Confluent API), schemas
registered and records written by confluent-kafka's own serializers, the local Apache Kafka broker, real Spark
(local), the stream asset run as the daemon launches it. One test per behaviour of typed records: evolution and
backfills, a writer the reader cannot resolve, the three decode-error policies with every record accounted for,
and both readers giving the same typed rows."""

from __future__ import annotations

import base64
import datetime as dt
import io
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import dagster as dg
import fastavro
import pytest

from dagster_streamgroup.dagster import StreamSparkResource, stream_asset
from dagster_streamgroup.formats.config import RegistryConfig
from dagster_streamgroup.formats.registry import SchemaSource
from dagster_streamgroup.formats.wire import frame
from dagster_streamgroup.protocol import EventKind
from tests.dagster.helpers import SensorDriver, group_name, group_resource, sensors_for
from tests.dagster.test_stream_asset import materializations, run
from tests.fixtures.kafka import TopicFactory
from tests.integration.formats.helpers import CLICK_V1, CLICK_V2, avro_values, produce, schema_id

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


@pytest.fixture(scope="module")
def spark() -> StreamSparkResource:
    return StreamSparkResource(master="local[1]")


def collecting_asset(group: str, rows: list[dict[str, Any]], **kwargs: Any) -> dg.AssetsDefinition:
    """A stream asset that keeps the typed rows it was given."""

    @stream_asset(group=group, name=f"typed_{group}", **kwargs)
    def typed(context: dg.AssetExecutionContext, df: Any) -> None:
        for row in df.select("partition", "offset", "value", "valueSchemaId", "decodeError").collect():
            rows.append(row.asDict(recursive=True))

    return typed


def typed_resource(bootstrap: str, topic: str, group: str, tmp_path: Path, registry_url: str, **kwargs: Any) -> Any:
    settings: dict[str, Any] = {"value_format": "avro", "max_records_per_run": 1000, **kwargs}
    return group_resource(bootstrap, topic, group, tmp_path, schema_registry_url=registry_url, **settings)


def v2_of(record: dict[str, Any], version: int) -> dict[str, Any]:
    """What a record written by ``version`` reads as under CLICK_V2 (Avro's resolution rules), as Spark returns it
    (timestamps in the session's zone, UTC, without a zone)."""
    if version == 2:
        return {**record, "at": record["at"].astimezone(dt.UTC).replace(tzinfo=None)}
    return {"id": record["id"], "page": record["page"], "price": None, "at": NAIVE_EPOCH, "kind": "VIEW", "tags": []}


NAIVE_EPOCH = EPOCH.replace(tzinfo=None)


def test_ranges_of_several_writer_versions_decode_into_the_latest_schema_and_backfills_too(
    kafka_bootstrap: str, kafka_topics: TopicFactory, registry_url: str, tmp_path: Path, spark: StreamSparkResource
) -> None:
    topic = kafka_topics(partitions=1)
    v1 = [{"id": i, "page": f"/p/{i}", "referrer": "r"} for i in range(3)]
    v2 = [
        {"id": 2**40 + i, "page": f"/q/{i}", "price": Decimal("12.34"), "at": EPOCH + dt.timedelta(seconds=i),
         "kind": "BUY", "tags": ["a", "b"]}
        for i in range(3)
    ]  # fmt: skip
    first = avro_values(registry_url, topic, CLICK_V1, v1)
    second = avro_values(registry_url, topic, CLICK_V2, v2)
    produce(kafka_bootstrap, topic, [first[0], second[0], first[1], second[1], first[2], second[2]])
    ids = (schema_id(registry_url, f"{topic}-value", 1), schema_id(registry_url, f"{topic}-value", 2))
    expected = [v2_of(v1[0], 1), v2_of(v2[0], 2), v2_of(v1[1], 1), v2_of(v2[1], 2), v2_of(v1[2], 1), v2_of(v2[2], 2)]

    group = group_name()
    resource = typed_resource(kafka_bootstrap, topic, group, tmp_path, registry_url)
    rows: list[dict[str, Any]] = []
    asset = collecting_asset(group, rows)
    with dg.instance_for_test() as instance:
        driver = SensorDriver(sensors_for(asset, members=1)[0], instance, resource)
        result = run(asset, instance, resource, spark, driver.request())
        assert result.success
        got = sorted(rows, key=lambda r: r["offset"])
        assert [r["value"] for r in got] == expected
        assert [r["valueSchemaId"] for r in got] == [ids[0], ids[1]] * 3
        assert all(r["decodeError"] is None for r in got)
        meta = materializations(result)[f"{topic}:0"]
        assert (meta["records"], meta["decoded"], meta["dead_lettered"], meta["nulled"]) == (6, 6, 0, 0)

        # A backfill decodes each record with the schema it was written with, into the latest; asked for the
        # first half, it re-processes the whole committed range [0, 6) that half lies in.
        rows.clear()
        again = run(asset, instance, resource, spark, (f"{topic}:0", 0, 3))
        assert again.success
        assert [r["value"] for r in sorted(rows, key=lambda r: r["offset"])] == expected


def test_a_writer_the_reader_cannot_resolve_parks_the_range_naming_subject_ids_and_field(
    kafka_bootstrap: str, kafka_topics: TopicFactory, registry_url: str, tmp_path: Path, spark: StreamSparkResource
) -> None:
    topic = kafka_topics(partitions=1)
    good = avro_values(registry_url, topic, CLICK_V1, [{"id": 1, "page": "/", "referrer": ""}])
    reader_id = schema_id(registry_url, f"{topic}-value")
    # A producer under another subject, whose schema has no `page`: the reader needs it and has no default for it.
    source = SchemaSource(RegistryConfig(url=registry_url))
    legacy = {"type": "record", "name": "Click", "namespace": "shop", "fields": [{"name": "id", "type": "int"}]}
    legacy_id = source.register(f"{topic}-legacy", json.dumps(legacy))
    payload = io.BytesIO()
    fastavro.schemaless_writer(payload, fastavro.parse_schema(legacy), {"id": 7})
    produce(kafka_bootstrap, topic, [good[0], frame(legacy_id, payload.getvalue())])

    group = group_name()
    resource = typed_resource(kafka_bootstrap, topic, group, tmp_path, registry_url, on_decode_error="dead_letter")
    rows: list[dict[str, Any]] = []
    asset = collecting_asset(group, rows)
    shard = f"{topic}:0"
    with dg.instance_for_test() as instance:
        driver = SensorDriver(sensors_for(asset, members=1)[0], instance, resource)
        result = run(asset, instance, resource, spark, driver.request())
        assert not result.success, "under any policy"
        state = resource.member("reader").load()
        assert state is not None
        assert state.shards[shard].committed == 0 and state.shards[shard].parked is not None
        parked = [e for e in state.events if e.kind is EventKind.PARKED and e.shard == shard]
        assert len(parked) == 1, state.events
        detail = parked[0].detail
        names = (f"subject {topic}-value", f"writer schema id {legacy_id}", f"reader schema id {reader_id}", "page")
        assert all(part in detail for part in names), detail
        assert state.shards[shard].attempt == 1, "parked at once: a retry would meet the same record"
        assert not driver.requests(), "a parked shard launches nothing"


BAD_PAYLOAD = b"\x01"
"""A long (-1), then a string whose length runs past the record's end."""


@pytest.mark.parametrize("policy", ["fail", "dead_letter", "null"])
def test_bad_records_follow_the_policy_and_every_record_is_accounted_for(
    policy: str,
    kafka_bootstrap: str,
    kafka_topics: TopicFactory,
    registry_url: str,
    tmp_path: Path,
    spark: StreamSparkResource,
) -> None:
    topic = kafka_topics(partitions=1)
    good = avro_values(registry_url, topic, CLICK_V1, [{"id": i, "page": "/", "referrer": ""} for i in range(3)])
    writer = schema_id(registry_url, f"{topic}-value")
    bad = [b'{"id": 1}', frame(2_000_000_000, good[0][5:]), frame(writer, BAD_PAYLOAD), None]
    values = [good[0], bad[0], good[1], bad[1], bad[2], bad[3], good[2]]
    produce(kafka_bootstrap, topic, values)
    bad_offsets = [1, 3, 4, 5]

    group = group_name()
    resource = typed_resource(kafka_bootstrap, topic, group, tmp_path, registry_url, on_decode_error=policy)
    rows: list[dict[str, Any]] = []
    asset = collecting_asset(group, rows)
    shard = f"{topic}:0"
    with dg.instance_for_test() as instance:
        driver = SensorDriver(sensors_for(asset, members=1)[0], instance, resource)
        result = run(asset, instance, resource, spark, driver.request())
        state = resource.member("reader").load()
        assert state is not None
        if policy == "fail":
            assert not result.success
            assert state.shards[shard].committed == 0 and state.shards[shard].parked is not None
            detail = next(e.detail for e in state.events if e.kind is EventKind.PARKED)
            assert "4 of 7 records could not be decoded" in detail and "offset 1: value: no magic byte" in detail
            assert sorted(r["offset"] for r in rows) == [0, 2, 6], "the function never saw a bad record"
            return
        assert result.success
        meta = materializations(result)[shard]
        assert meta["decoded"] + meta["dead_lettered"] + meta["nulled"] == meta["records"] == 7 == meta["end"]
        assert state.shards[shard].committed == 7
        if policy == "dead_letter":
            assert (meta["decoded"], meta["dead_lettered"]) == (3, 4)
            assert sorted(r["offset"] for r in rows) == [0, 2, 6]
            (letter,) = state.dead_letters
            assert (letter.shard, letter.start, letter.end, letter.dead_records) == (shard, 0, 7, 4)
            assert [r.offset for r in letter.records] == bad_offsets
            kept = [None if r.value is None else base64.b64decode(r.value) for r in letter.records]
            assert kept == bad, "the raw bytes as they were written"
            errors = [r.error for r in letter.records]
            assert "no magic byte" in errors[0] and "schema id 2000000000 is unknown to the registry" in errors[1]
            assert f"does not decode with writer schema id {writer}" in errors[2] and "tombstone" in errors[3]
            assert any(e.kind is EventKind.DEAD_LETTER and e.shard == shard for e in state.events)
        else:
            assert (meta["decoded"], meta["nulled"]) == (3, 4)
            by_offset = {r["offset"]: r for r in rows}
            assert sorted(by_offset) == list(range(7))
            assert all(by_offset[o]["value"] is None and by_offset[o]["decodeError"] for o in bad_offsets)
            assert not state.dead_letters


def test_both_readers_give_the_same_typed_rows(
    kafka_bootstrap: str, kafka_topics: TopicFactory, registry_url: str, tmp_path: Path, spark: StreamSparkResource
) -> None:
    topic = kafka_topics(partitions=2)
    v2 = [
        {"id": i, "page": f"/q/{i}", "price": Decimal(i) / 4, "at": EPOCH + dt.timedelta(days=i), "kind": "BUY",
         "tags": [str(i)] * (i % 3)}
        for i in range(40)
    ]  # fmt: skip
    values = avro_values(registry_url, topic, CLICK_V2, v2)
    produce(kafka_bootstrap, topic, [*values[:20], b"not avro"], partition=0)
    produce(kafka_bootstrap, topic, values[20:], partition=1)
    ranges = {f"{topic}:0": (0, 21), f"{topic}:1": (0, 20)}
    session = spark.spark_session
    shapes = {}
    for reader in ("python", "spark-kafka"):
        resource = typed_resource(
            kafka_bootstrap, topic, group_name(), tmp_path, registry_url, spark_reader=reader, on_decode_error="null"
        )
        df = resource.read_ranges(session, ranges)
        rows = [r.asDict(recursive=True) for r in df.orderBy("partition", "offset").collect()]
        shapes[reader] = (df.schema, rows)
    assert shapes["python"][0] == shapes["spark-kafka"][0]
    assert shapes["python"][1] == shapes["spark-kafka"][1]
    rows = shapes["python"][1]
    assert len(rows) == 41 and rows[20]["decodeError"].startswith("value: no magic byte")
    assert [r["value"] for r in rows if r["value"] is not None] == [v2_of(r, 2) for r in v2]
