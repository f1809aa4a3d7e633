"""Avro records into Arrow columns of the reader schema's types, as Spark's ``from_avro`` types them.

The types follow spark-avro's ``SchemaConverters``: records are structs, enums strings, ``[null, T]`` a nullable
``T``, other unions structs of ``member0``, ``member1``, ... (``[int, long]`` a long, ``[float, double]`` a
double), maps ``map<string, V>``, decimals decimals, ``date`` dates, ``timestamp-*`` Spark timestamps and
``local-timestamp-*`` timestamps without a zone, fixed and bytes binary.

Decoding has two paths with the same result. The fast one hands a batch's payloads of one writer schema to Polars'
Avro reader as one block of an Avro object container (Rust, no Python work per record), then resolves the writer's
columns into the reader's (Avro's rules: fields by name, defaults for missing ones, promotions, enum symbols)
column by column. Whatever it cannot do (maps, unions of several types, a default of a complex type, a block with a
record that does not decode) goes through fastavro record by record, which resolves every case and pins a failure
on its record. A writer schema the reader cannot resolve is found before any record is decoded, by Apache Avro's
own compatibility checker, which names the fields.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from functools import cache
from typing import Any

import pyarrow as pa

from dagster_streamgroup.formats.arrow import conform
from dagster_streamgroup.formats.wire import zigzag_varint

AvroSchema = Any
"""A parsed Avro schema as fastavro gives it (dicts, lists and names)."""

_OCF_SYNC = b"streamgroup-sync"


def parse(text: str | Mapping[str, Any]) -> AvroSchema:
    """The schema, with named types expanded where they are used (fastavro's parse)."""
    import fastavro

    raw = json.loads(text) if isinstance(text, str) else dict(text)
    return fastavro.parse_schema(raw, _write_hint=False, _force=True)


def canonical_text(schema: AvroSchema) -> str:
    return json.dumps(schema, sort_keys=True, separators=(",", ":"))


def full_name(schema: AvroSchema) -> str | None:
    """The record's fully qualified name (RecordNameStrategy's subject)."""
    if isinstance(schema, dict) and schema.get("type") in ("record", "error"):
        return str(schema["name"])
    return None


def _logical(schema: AvroSchema) -> str | None:
    return schema.get("logicalType") if isinstance(schema, dict) else None


def _kind(schema: AvroSchema) -> str:
    if isinstance(schema, list):
        return "union"
    if isinstance(schema, dict):
        return str(schema["type"]) if not isinstance(schema["type"], (dict, list)) else _kind(schema["type"])
    return str(schema)


def _non_null(branches: Sequence[AvroSchema]) -> list[AvroSchema]:
    return [b for b in branches if b != "null" and _kind(b) != "null"]


def arrow_type(schema: AvroSchema) -> pa.DataType:
    """The Arrow type of values of ``schema`` (Spark's type for it, through pyspark's Arrow mapping)."""
    kind = _kind(schema)
    logical = _logical(schema)
    if kind == "union":
        branches = _non_null(schema)
        if len(branches) == 1:
            return arrow_type(branches[0])
        kinds = {_kind(b) for b in branches if _logical(b) is None}
        if len(kinds) == len(branches) and kinds == {"int", "long"}:
            return pa.int64()
        if len(kinds) == len(branches) and kinds == {"float", "double"}:
            return pa.float64()
        return pa.struct([pa.field(f"member{i}", arrow_type(b)) for i, b in enumerate(branches)])
    if isinstance(schema, dict) and isinstance(schema["type"], (dict, list)):
        return arrow_type(schema["type"])
    if logical == "decimal" and kind in ("bytes", "fixed"):
        return pa.decimal128(int(schema["precision"]), int(schema.get("scale", 0)))
    if logical == "date" and kind == "int":
        return pa.date32()
    if logical in ("timestamp-millis", "timestamp-micros") and kind == "long":
        return pa.timestamp("us", tz="UTC")
    if logical in ("local-timestamp-millis", "local-timestamp-micros") and kind == "long":
        return pa.timestamp("us")
    simple = {
        "null": pa.null(),
        "boolean": pa.bool_(),
        "int": pa.int32(),
        "long": pa.int64(),
        "float": pa.float32(),
        "double": pa.float64(),
        "bytes": pa.binary(),
        "string": pa.string(),
        "fixed": pa.binary(),
        "enum": pa.string(),
    }
    if kind in simple:
        return simple[kind]
    if kind in ("record", "error"):
        return pa.struct([pa.field(f["name"], arrow_type(f["type"])) for f in schema["fields"]])
    if kind == "array":
        return pa.list_(arrow_type(schema["items"]))
    if kind == "map":
        return pa.map_(pa.string(), arrow_type(schema["values"]))
    raise ValueError(f"Avro type {kind!r} has no Spark type")


def incompatibility(writer: AvroSchema, reader: AvroSchema) -> str | None:
    """Why records of ``writer`` cannot be read as ``reader`` under Avro's resolution rules, naming the fields
    (Apache Avro's checker); ``None`` when they can."""
    import avro.schema
    from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType

    result = ReaderWriterCompatibilityChecker().get_compatibility(  # type: ignore[no-untyped-call]
        avro.schema.parse(canonical_text(reader)), avro.schema.parse(canonical_text(writer))
    )
    if result.compatibility is SchemaCompatibilityType.compatible:
        return None
    fields = sorted({_field_path(reader, location) for location in result.locations})
    messages = sorted(
        f"reader field {m!r} has no default and the writer has no such field" if " " not in m else m
        for m in result.messages
    )
    return f"field {', '.join(fields)}: {'; '.join(messages)}"


def _field_path(schema: AvroSchema, pointer: str) -> str:
    """``/fields/2/type/fields/0/type`` of a reader schema as the field path ``z.q``."""
    names: list[str] = []
    node: Any = schema
    parts = [p for p in pointer.split("/") if p]
    i = 0
    while i < len(parts):
        part = parts[i]
        if part == "fields" and i + 1 < len(parts) and isinstance(node, dict):
            field = node["fields"][int(parts[i + 1])]
            names.append(str(field["name"]))
            node = field
            i += 2
            continue
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit():
            node = node[int(part)]
        i += 1
    return ".".join(names) or "(the record itself)"


# -- the fast path ------------------------------------------------------------------------------------------------


def _without_defaults(node: Any) -> Any:
    """A schema without its fields' defaults, docs and aliases: none of them matters to decoding with the writer
    schema, and Polars' reader refuses some defaults (an empty string's: "OutOfSpec")."""
    if isinstance(node, list):
        return [_without_defaults(item) for item in node]
    if isinstance(node, dict):
        return {k: _without_defaults(v) for k, v in node.items() if k not in ("default", "doc", "aliases")}
    return node


@cache
def _container_header(writer_text: str) -> bytes:
    stripped = json.dumps(_without_defaults(json.loads(writer_text)))
    meta = {"avro.schema": stripped.encode(), "avro.codec": b"null"}
    head = bytearray(b"Obj\x01") + zigzag_varint(len(meta))
    for key, value in meta.items():
        head += zigzag_varint(len(key)) + key.encode() + zigzag_varint(len(value)) + value
    return bytes(head + zigzag_varint(0) + _OCF_SYNC)


def _container(writer_text: str, payloads: pa.BinaryArray) -> bytes:
    """``payloads`` as one block of an Avro object container file of schema ``writer_text``."""
    offsets_buffer, data_buffer = payloads.buffers()[1], payloads.buffers()[2]
    offsets = memoryview(offsets_buffer).cast("i")[payloads.offset : payloads.offset + len(payloads) + 1]
    start, end = offsets[0], offsets[-1]
    data = memoryview(b"") if data_buffer is None else memoryview(data_buffer)[start:end]
    return b"".join(
        [_container_header(writer_text), zigzag_varint(len(payloads)), zigzag_varint(len(data)), data, _OCF_SYNC]
    )


def _polars_supports(schema: AvroSchema) -> bool:
    """Polars' Avro reader reads these; maps and unions of several types it does not."""
    kind = _kind(schema)
    if kind == "union":
        branches = _non_null(schema)
        return len(branches) == 1 and _polars_supports(branches[0])
    if isinstance(schema, dict) and isinstance(schema["type"], (dict, list)):
        return _polars_supports(schema["type"])
    if kind == "map":
        return False
    if kind in ("record", "error"):
        return all(_polars_supports(f["type"]) for f in schema["fields"])
    if kind == "array":
        return _polars_supports(schema["items"])
    return True


def _fast_decode(writer_text: str, writer: AvroSchema, payloads: pa.BinaryArray) -> pa.Array | None:
    """The payloads as an Arrow array of the writer's types, or ``None`` when Polars cannot (the caller goes
    record by record)."""
    if not _polars_supports(writer) or _kind(writer) not in ("record", "error"):
        return None
    import polars as pl

    try:
        frame = pl.read_avro(io.BytesIO(_container(writer_text, payloads)))
    except BaseException as exc:  # Polars' Rust panics arrive as pyo3's PanicException, a BaseException
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return None
    if frame.height != len(payloads):
        return None
    table = frame.to_arrow()
    return pa.StructArray.from_arrays(
        [table.column(i).combine_chunks() for i in range(table.num_columns)], names=table.column_names
    )


class _UnsupportedError(Exception):
    """The column-wise resolution cannot do this case; the caller decodes record by record."""


def _resolve(array: pa.Array, writer: AvroSchema, reader: AvroSchema) -> pa.Array:
    """``array`` (values of ``writer`` as Polars read them) as values of ``reader`` (its Arrow type)."""
    target = arrow_type(reader)
    w_kind, r_kind = _kind(writer), _kind(reader)
    if w_kind == "union":
        branches = _non_null(writer)
        if len(branches) != 1:
            raise _UnsupportedError("a union of several types")
        if r_kind != "union" and array.null_count:
            raise _UnsupportedError("a null written where the reader has no null")
        return _resolve(array, branches[0], reader)
    if r_kind == "union":
        branches = _non_null(reader)
        if len(branches) != 1:
            raise _UnsupportedError("a union of several types")
        return _resolve(array, writer, branches[0])
    if isinstance(writer, dict) and isinstance(writer["type"], (dict, list)):
        return _resolve(array, writer["type"], reader)
    if isinstance(reader, dict) and isinstance(reader["type"], (dict, list)):
        return _resolve(array, writer, reader["type"])
    if r_kind in ("record", "error"):
        if w_kind not in ("record", "error") or not isinstance(array, pa.StructArray):
            raise _UnsupportedError("a record from a non-record")
        by_name = {f["name"]: f for f in writer["fields"]}
        children = []
        for field in reader["fields"]:
            source = by_name.get(field["name"]) or next(
                (by_name[a] for a in field.get("aliases", []) if a in by_name), None
            )
            if source is not None:
                child = array.field(source["name"])
                children.append(_resolve(child, source["type"], field["type"]))
            elif "default" in field:
                children.append(_default_array(field["type"], field["default"], len(array)))
            else:
                raise _UnsupportedError(f"reader field {field['name']!r} has no default")
        return pa.StructArray.from_arrays(
            children, fields=list(target), mask=array.is_null() if array.null_count else None
        )
    if r_kind == "enum":
        values = conform(array, pa.string())
        symbols = set(reader["symbols"])
        written = {v for v in values.unique().to_pylist() if v is not None}
        unknown = written - symbols
        if unknown:
            default = reader.get("default")
            if default is None:
                raise _UnsupportedError("an enum symbol the reader lacks")
            import pyarrow.compute as pc

            values = pc.if_else(pc.is_in(values, pa.array(sorted(symbols))), values, pa.scalar(default))
        return values
    if r_kind == "array":
        if w_kind != "array" or not isinstance(array, (pa.ListArray, pa.LargeListArray)):
            raise _UnsupportedError("an array from a non-array")
        items = _resolve(array.values, writer["items"], reader["items"])
        offsets = array.offsets.cast(pa.int32()) if isinstance(array, pa.LargeListArray) else array.offsets
        return pa.ListArray.from_arrays(offsets, items, mask=array.is_null() if array.null_count else None)
    if r_kind == "map" or w_kind == "map":
        raise _UnsupportedError("maps")
    if r_kind in ("fixed", "bytes") and _logical(reader) == "decimal" and _logical(writer) != "decimal":
        raise _UnsupportedError("a decimal from a non-decimal")
    return conform(array, target)


def _default_array(schema: AvroSchema, default: Any, n: int) -> pa.Array:
    """``n`` copies of a field's default (Avro's JSON form of it), as the field's Arrow type."""
    kind = _kind(schema)
    if kind == "union":  # a union's default belongs to its first branch
        first = schema[0]
        if first == "null" or _kind(first) == "null":
            return pa.nulls(n, arrow_type(schema))
        return _default_array(first, default, n).cast(arrow_type(schema))
    target = arrow_type(schema)
    if kind in ("record", "error", "map", "array", "fixed", "bytes"):
        raise _UnsupportedError("a default of a complex type")
    if _logical(schema) is not None:
        raise _UnsupportedError("a default of a logical type")
    return pa.array([default] * n, target)


# -- the record-by-record path ------------------------------------------------------------------------------------


def _python_value(value: Any, schema: AvroSchema) -> Any:
    """A value fastavro decoded as pyarrow takes it for ``arrow_type(schema)``."""
    if value is None:
        return None
    kind = _kind(schema)
    if kind == "union":
        branches = _non_null(schema)
        if len(branches) == 1:
            return _python_value(value, branches[0])
        target = arrow_type(schema)
        if not pa.types.is_struct(target):  # [int, long] / [float, double]
            return value
        record_name = None
        if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str):
            record_name, value = value
        index = _union_branch(value, branches, record_name)
        return {f"member{i}": (_python_value(value, b) if i == index else None) for i, b in enumerate(branches)}
    if isinstance(schema, dict) and isinstance(schema["type"], (dict, list)):
        return _python_value(value, schema["type"])
    if kind in ("record", "error"):
        return {f["name"]: _python_value(value.get(f["name"]), f["type"]) for f in schema["fields"]}
    if kind == "array":
        return [_python_value(v, schema["items"]) for v in value]
    if kind == "map":
        return [(k, _python_value(v, schema["values"])) for k, v in value.items()]
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(UTC)
    return value


_PY_TYPES: dict[str, tuple[type, ...]] = {
    "boolean": (bool,),
    "int": (int,),
    "long": (int,),
    "float": (float,),
    "double": (float,),
    "string": (str,),
    "enum": (str,),
    "bytes": (bytes,),
    "fixed": (bytes,),
    "array": (list,),
    "map": (dict,),
    "record": (dict,),
}


def _union_branch(value: Any, branches: Sequence[AvroSchema], record_name: str | None) -> int:
    if record_name is not None:
        for i, branch in enumerate(branches):
            if isinstance(branch, dict) and branch.get("name") == record_name:
                return i
    for i, branch in enumerate(branches):
        logical = _logical(branch)
        if logical is not None:
            kinds: tuple[type, ...] = {"decimal": (Decimal,), "uuid": (str,)}.get(logical, (datetime, object))
        else:
            kinds = _PY_TYPES.get(_kind(branch), (object,))
        if isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds):
            return i
    return 0


def decode_records(
    payloads: Sequence[bytes | None], writer: AvroSchema, reader: AvroSchema
) -> tuple[pa.Array, list[str | None]]:
    """Record by record with fastavro (resolving ``writer`` into ``reader``): the values and each record's error."""
    import fastavro

    target = arrow_type(reader)
    values: list[Any] = []
    errors: list[str | None] = []
    for payload in payloads:
        if payload is None:
            values.append(None)
            errors.append(None)
            continue
        buffer = io.BytesIO(payload)
        try:
            decoded = fastavro.schemaless_reader(buffer, writer, reader, return_record_name=True)
            if buffer.tell() != len(payload):
                raise ValueError(f"{len(payload) - buffer.tell()} bytes left after the record")
            value = _python_value(decoded, reader)
            pa.array([value], target)  # a value Arrow refuses is this record's error, not the batch's
        except Exception as exc:
            values.append(None)
            errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
            continue
        values.append(value)
        errors.append(None)
    return pa.array(values, target), errors


def decode(
    payloads: pa.BinaryArray, writer_text: str, writer: AvroSchema, reader: AvroSchema
) -> tuple[pa.Array, list[str | None] | None]:
    """Payloads of one writer schema as values of ``reader``: the array and, when some failed, each record's error
    (``None`` when every record decoded)."""
    fast = _fast_decode(writer_text, writer, payloads)
    if fast is not None:
        try:
            return _resolve(fast, writer, reader), None
        except _UnsupportedError:
            pass
    values, errors = decode_records(payloads.to_pylist(), writer, reader)
    return values, errors if any(e is not None for e in errors) else None
