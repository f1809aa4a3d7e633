"""The Confluent framing and the Avro decoders, with no server: headers read with numpy agree with reading them one
record at a time, and the fast path (Polars' reader, column-wise resolution) gives exactly what fastavro gives
record by record, for generated records of writer and reader schemas related by every rule of Avro's resolution."""

from __future__ import annotations

import io
import json
from decimal import Decimal
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dagster_streamgroup.formats import avro
from dagster_streamgroup.formats.wire import (
    frame,
    parse_frames,
    read_message_indexes,
    unframe,
)


@settings(deadline=None)
@given(st.integers(0, 2**31 - 1), st.binary(max_size=64))
def test_frame_and_unframe_are_inverse(schema_id: int, payload: bytes) -> None:
    assert unframe(frame(schema_id, payload)) == (schema_id, payload)


@settings(deadline=None)
@given(st.lists(st.integers(0, 1000), min_size=1, max_size=6), st.binary(max_size=8))
def test_protobuf_message_indexes_round_trip(indexes: list[int], payload: bytes) -> None:
    data = frame(7, payload, indexes)
    assert read_message_indexes(data, 5) == (indexes, len(data) - len(payload))


records = st.one_of(
    st.none(),
    st.binary(max_size=12),
    st.builds(frame, st.integers(0, 2**31 - 1), st.binary(max_size=12)),
)


@settings(deadline=None)
@given(st.lists(records, max_size=40), st.integers(0, 5))
def test_headers_read_with_numpy_agree_with_one_record_at_a_time(values: list[bytes | None], cut: int) -> None:
    column = pa.array(values, pa.binary()).slice(min(cut, len(values)))
    frames = parse_frames(column)
    for i, value in enumerate(column.to_pylist()):
        if value is None:
            assert frames.nulls[i] and frames.schema_ids[i] == -1
            continue
        try:
            schema_id, payload = unframe(value)
        except ValueError:
            assert frames.schema_ids[i] == -1 and (frames.too_short[i] or frames.no_magic[i])
            continue
        assert frames.schema_ids[i] == schema_id and frames.payloads[i].as_py() == payload


WRITER = {
    "type": "record",
    "name": "Click",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "int"},
        {"name": "page", "type": "string"},
        {"name": "gone", "type": "string"},
        {"name": "score", "type": "float"},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
        {"name": "maybe", "type": ["null", "long"]},
        {"name": "items", "type": {"type": "array", "items": {
            "type": "record", "name": "Item", "fields": [{"name": "n", "type": "int"}]}}},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    ],
}  # fmt: skip
READER = {
    "type": "record",
    "name": "Click",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "page", "type": ["null", "string"], "default": None},
        {"name": "score", "type": "double"},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B", "C"]}},
        {"name": "maybe", "type": ["null", "long"], "default": None},
        {"name": "items", "type": {"type": "array", "items": {
            "type": "record", "name": "Item", "fields": [{"name": "n", "type": "long"},
                                                          {"name": "m", "type": "int", "default": 3}]}}},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "added", "type": "string", "default": "d"},
        {"name": "count", "type": "int", "default": 7},
    ],
}  # fmt: skip
"""Every rule at once: promotions (int->long, float->double), a field removed, fields added with defaults, a
nullable union from a plain type, an enum gaining a symbol, a nested record in an array evolving, logical types."""

writer_records = st.fixed_dictionaries(
    {
        "id": st.integers(-(2**31), 2**31 - 1),
        "page": st.text(max_size=8),
        "gone": st.text(max_size=4),
        "score": st.floats(width=32, allow_nan=False),
        "kind": st.sampled_from(["A", "B"]),
        "maybe": st.none() | st.integers(-(2**63), 2**63 - 1),
        "items": st.lists(st.fixed_dictionaries({"n": st.integers(-100, 100)}), max_size=3),
        "price": st.decimals(min_value=-9999999, max_value=9999999, places=2, allow_nan=False, allow_infinity=False),
        "day": st.dates(),
    }
)


def _payloads(records: list[dict[str, Any]]) -> pa.BinaryArray:
    schema = fastavro.parse_schema(WRITER)
    out = []
    for record in records:
        buffer = io.BytesIO()
        fastavro.schemaless_writer(buffer, schema, record)
        out.append(buffer.getvalue())
    return pa.array(out, pa.binary())  # type: ignore[return-value]


@settings(max_examples=40, deadline=None)
@given(st.lists(writer_records, min_size=1, max_size=20))
def test_the_fast_path_resolves_exactly_as_fastavro_does(records: list[dict[str, Any]]) -> None:
    writer, reader = avro.parse(WRITER), avro.parse(READER)
    assert avro.incompatibility(writer, reader) is None
    payloads = _payloads(records)
    fast = avro._fast_decode(json.dumps(WRITER), writer, payloads)
    assert fast is not None, "Polars reads this writer"
    resolved = avro._resolve(fast, writer, reader)
    slow, errors = avro.decode_records(payloads.to_pylist(), writer, reader)
    assert errors == [None] * len(records)
    assert resolved.type == slow.type == avro.arrow_type(reader)
    assert resolved.to_pylist() == slow.to_pylist()
    first = resolved.to_pylist()[0]
    assert first["added"] == "d" and first["count"] == 7 and "gone" not in first
    assert first["items"] == [{"n": r["n"], "m": 3} for r in records[0]["items"]]
    assert first["price"] == Decimal(records[0]["price"])


def test_a_block_with_a_bad_record_is_decoded_record_by_record_and_the_bad_one_named() -> None:
    writer = avro.parse(WRITER)
    good = _payloads([{"id": 1, "page": "p", "gone": "", "score": 1.0, "kind": "A", "maybe": None, "items": [],
                       "price": Decimal("1.00"), "day": __import__("datetime").date(2020, 1, 1)}])  # fmt: skip
    payloads = pa.array([good[0].as_py(), b"\x01", good[0].as_py()], pa.binary())
    values, errors = avro.decode(payloads, json.dumps(WRITER), writer, avro.parse(READER))  # type: ignore[arg-type]
    assert errors is not None and errors[0] is None and errors[2] is None and errors[1]
    assert values.to_pylist()[1] is None and values.to_pylist()[0]["id"] == 1


def test_an_unresolvable_writer_names_the_fields() -> None:
    reader = avro.parse({**READER, "fields": [*READER["fields"], {"name": "country", "type": "string"}]})
    problem = avro.incompatibility(avro.parse(WRITER), reader)
    assert problem is not None and problem.startswith("field country:") and "no default" in problem
    narrowed = {**WRITER, "fields": [{"name": "id", "type": "long"}]}
    problem = avro.incompatibility(avro.parse(narrowed), avro.parse({**WRITER, "fields": [WRITER["fields"][0]]}))
    assert problem is not None and "field id" in problem and "long" in problem


@pytest.mark.parametrize(
    ("schema", "arrow"),
    [
        ({"type": "map", "values": "int"}, pa.map_(pa.string(), pa.int32())),
        (["null", "int", "string"], pa.struct([pa.field("member0", pa.int32()), pa.field("member1", pa.string())])),
        (["int", "long"], pa.int64()),
        ({"type": "long", "logicalType": "timestamp-millis"}, pa.timestamp("us", tz="UTC")),
        ({"type": "long", "logicalType": "local-timestamp-micros"}, pa.timestamp("us")),
        ({"type": "fixed", "name": "F", "size": 4}, pa.binary()),
    ],
)
def test_types_are_those_spark_avro_gives(schema: Any, arrow: pa.DataType) -> None:
    assert avro.arrow_type(avro.parse({"type": "record", "name": "R", "fields": [{"name": "f", "type": schema}]})) == (
        pa.struct([pa.field("f", arrow)])
    )


def test_maps_and_unions_of_several_types_decode_record_by_record() -> None:
    fields = [{"name": "m", "type": {"type": "map", "values": "int"}}, {"name": "u", "type": ["null", "int", "string"]}]
    schema = {"type": "record", "name": "R", "fields": fields}
    parsed = avro.parse(schema)
    out = []
    for record in ({"m": {"a": 1}, "u": "s"}, {"m": {}, "u": 3}, {"m": {}, "u": None}):
        buffer = io.BytesIO()
        fastavro.schemaless_writer(buffer, parsed, record)
        out.append(buffer.getvalue())
    values, errors = avro.decode(pa.array(out, pa.binary()), json.dumps(schema), parsed, parsed)  # type: ignore[arg-type]
    assert errors is None
    assert values.to_pylist() == [
        {"m": [("a", 1)], "u": {"member0": None, "member1": "s"}},
        {"m": [], "u": {"member0": 3, "member1": None}},
        {"m": [], "u": None},
    ]


@pytest.mark.parametrize("default", ["", "x", None, 0])
def test_the_fast_path_reads_writers_whose_fields_have_defaults(default: Any) -> None:
    """Polars' reader refused a writer schema with an empty string's default (every batch of such a writer went
    record by record); the writer's defaults do not matter to decoding with it."""
    kind = {str: "string", type(None): ["null", "string"], int: "int"}[type(default)]
    schema = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"},
              {"name": "c", "type": kind, "default": default}]}  # fmt: skip
    parsed = avro.parse(schema)
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, parsed, {"a": 1, "c": default})
    fast = avro._fast_decode(json.dumps(schema), parsed, pa.array([buffer.getvalue()] * 3, pa.binary()))  # type: ignore[arg-type]
    assert fast is not None and fast.to_pylist() == [{"a": 1, "c": default}] * 3
