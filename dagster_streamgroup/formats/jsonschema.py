"""JSON records (``json_schema`` in the Confluent framing, or plain ``json`` with a given schema) into Arrow columns
of the JSON Schema's types.

Types: an object with ``properties`` is a struct (fields in the order of ``properties``), an object with only
``additionalProperties`` a ``map<string, V>``, ``array`` a list, ``integer`` a long, ``number`` a double,
``string`` with ``format: date-time`` a timestamp and ``format: date`` a date, ``["T", "null"]`` (or ``anyOf``
/ ``oneOf`` of one type and ``null``) a nullable ``T``; ``$ref`` to ``#/definitions`` or ``#/$defs`` is followed.
JSON Schema's evolution is the JSON's own: a property the schema lacks is ignored, one the record lacks is null.

Decoding hands a batch's records to Arrow's JSON reader as lines (C++, no Python work per record) with the
schema's types; a batch holding a record it refuses is read again record by record, which pins the failure on
its record. Records are decoded, not validated against the schema (``required``, ``minimum`` ... are not
checked): a value of another type than the schema's is a decode error.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from dagster_streamgroup.formats.arrow import conform

JsonSchema = Mapping[str, Any]


def parse(text: str | Mapping[str, Any]) -> JsonSchema:
    schema = json.loads(text) if isinstance(text, str) else dict(text)
    if not isinstance(schema, dict):
        raise ValueError("a JSON Schema must be a JSON object")
    arrow_type(schema)  # refuses a schema with no Spark type now, naming the path
    return schema


def title(schema: JsonSchema) -> str | None:
    """The record name a JSON Schema gives (``title``), for RecordNameStrategy."""
    value = schema.get("title")
    return str(value) if value is not None else None


def _deref(node: Mapping[str, Any], root: JsonSchema, path: str) -> Mapping[str, Any]:
    seen = 0
    while "$ref" in node:
        ref = str(node["$ref"])
        if not ref.startswith("#/"):
            raise ValueError(f"{path}: $ref {ref!r} is not a reference inside the schema (#/...)")
        target: Any = root
        for part in ref[2:].split("/"):
            if not isinstance(target, Mapping) or part not in target:
                raise ValueError(f"{path}: $ref {ref!r} names nothing in the schema")
            target = target[part]
        node = target
        seen += 1
        if seen > 32:
            raise ValueError(f"{path}: $ref {ref!r} is recursive; recursive schemas have no Spark type")
    return node


def arrow_type(schema: JsonSchema, root: JsonSchema | None = None, path: str = "$", depth: int = 0) -> pa.DataType:
    """The Arrow type of values of ``schema``; ``ValueError`` naming the path of a part with none."""
    root = schema if root is None else root
    if depth > 32:
        raise ValueError(f"{path}: nested more than 32 deep (a recursive schema has no Spark type)")
    node = _deref(schema, root, path)
    for key in ("anyOf", "oneOf"):
        if key in node:
            branches = [b for b in node[key] if _deref(b, root, path).get("type") != "null"]
            if len(branches) != 1:
                raise ValueError(f"{path}: {key} of several non-null types has no single Spark type")
            return arrow_type(branches[0], root, path, depth + 1)
    kind = node.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        if len(kinds) != 1:
            raise ValueError(f"{path}: type {kind} has no single Spark type")
        kind = kinds[0]
    if kind is None and "properties" in node:
        kind = "object"
    if kind == "object":
        properties = node.get("properties")
        if properties:
            return pa.struct(
                [pa.field(name, arrow_type(sub, root, f"{path}.{name}", depth + 1)) for name, sub in properties.items()]
            )
        extra = node.get("additionalProperties")
        if isinstance(extra, Mapping):
            return pa.map_(pa.string(), arrow_type(extra, root, f"{path}.*", depth + 1))
        raise ValueError(f"{path}: an object needs properties, or additionalProperties with a schema")
    if kind == "array":
        items = node.get("items")
        if not isinstance(items, Mapping):
            raise ValueError(f"{path}: an array needs items with one schema")
        return pa.list_(arrow_type(items, root, f"{path}[]", depth + 1))
    if kind == "string":
        fmt = node.get("format")
        if fmt == "date-time":
            return pa.timestamp("us", tz="UTC")
        if fmt == "date":
            return pa.date32()
        return pa.string()
    simple = {"integer": pa.int64(), "number": pa.float64(), "boolean": pa.bool_()}
    if kind in simple:
        return simple[kind]
    raise ValueError(f"{path}: type {kind!r} has no Spark type")


def _read_type(target: pa.DataType) -> pa.DataType:
    """What Arrow's JSON reader is asked for: temporal values as the strings they are in JSON (cast after)."""
    if pa.types.is_timestamp(target) or pa.types.is_date(target):
        return pa.string()
    if pa.types.is_struct(target):
        return pa.struct([pa.field(f.name, _read_type(f.type)) for f in target])
    if pa.types.is_list(target):
        return pa.list_(_read_type(target.value_type))
    if pa.types.is_map(target):
        return pa.struct([])  # maps are read record by record: the JSON reader has no map type
    return target


def _has_map(target: pa.DataType) -> bool:
    if pa.types.is_map(target):
        return True
    if pa.types.is_struct(target):
        return any(_has_map(f.type) for f in target)
    if pa.types.is_list(target):
        return _has_map(target.value_type)
    return False


def _lines(payloads: pa.BinaryArray) -> bytes | None:
    """The records as JSON lines; ``None`` when one is empty or not a JSON object (read record by record)."""
    out = []
    for value in payloads.to_pylist():
        if value is None:
            return None
        stripped = value.strip()
        if not stripped.startswith(b"{"):
            return None
        out.append(stripped.replace(b"\n", b" ").replace(b"\r", b" "))
    return b"\n".join(out) + b"\n"


def _read_lines(data: bytes, target: pa.StructType) -> pa.Array:
    import pyarrow.json as pj

    schema = pa.schema(list(_read_type(target)))
    table = pj.read_json(
        io.BytesIO(data),
        read_options=pj.ReadOptions(use_threads=False, block_size=max(1 << 20, len(data) + 1)),
        parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"),
    )
    columns = [table.column(i).combine_chunks() for i in range(table.num_columns)]
    read = pa.StructArray.from_arrays(columns, names=table.column_names) if columns else pa.array([{}] * table.num_rows)
    return conform(read, target)


def _python_value(value: Any, target: pa.DataType) -> Any:
    if value is None:
        return None
    if pa.types.is_struct(target):
        if not isinstance(value, dict):
            raise TypeError(f"expected an object, got {type(value).__name__}")
        return {f.name: _python_value(value.get(f.name), f.type) for f in target}
    if pa.types.is_map(target):
        if not isinstance(value, dict):
            raise TypeError(f"expected an object, got {type(value).__name__}")
        return [(k, _python_value(v, target.item_type)) for k, v in value.items()]
    if pa.types.is_list(target):
        if not isinstance(value, list):
            raise TypeError(f"expected an array, got {type(value).__name__}")
        return [_python_value(v, target.value_type) for v in value]
    if pa.types.is_timestamp(target) or pa.types.is_date(target):
        if not isinstance(value, str):
            raise TypeError(f"expected a date or time string, got {type(value).__name__}")
        return pa.scalar(value).cast(target).as_py()
    if pa.types.is_integer(target) and (not isinstance(value, int) or isinstance(value, bool)):
        raise TypeError(f"expected an integer, got {json.dumps(value)[:40]}")
    if pa.types.is_floating(target) and (not isinstance(value, (int, float)) or isinstance(value, bool)):
        raise TypeError(f"expected a number, got {json.dumps(value)[:40]}")
    if pa.types.is_boolean(target) and not isinstance(value, bool):
        raise TypeError(f"expected a boolean, got {json.dumps(value)[:40]}")
    if pa.types.is_string(target) and not isinstance(value, str):
        raise TypeError(f"expected a string, got {json.dumps(value)[:40]}")
    return value


def decode_records(payloads: Sequence[bytes | None], target: pa.DataType) -> tuple[pa.Array, list[str | None]]:
    values: list[Any] = []
    errors: list[str | None] = []
    for payload in payloads:
        if payload is None:
            values.append(None)
            errors.append(None)
            continue
        try:
            value = _python_value(json.loads(payload), target)
            pa.array([value], target)
        except Exception as exc:
            values.append(None)
            errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
            continue
        values.append(value)
        errors.append(None)
    return pa.array(values, target), errors


def decode(payloads: pa.BinaryArray, target: pa.DataType) -> tuple[pa.Array, list[str | None] | None]:
    """The JSON payloads as values of ``target`` (an object's struct or map type): the array and, when some
    failed, each record's error."""
    if pa.types.is_struct(target) and not _has_map(target) and len(payloads):
        data = _lines(payloads)
        if data is not None:
            try:
                read = _read_lines(data, target)
                if len(read) == len(payloads):
                    return read, None
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
                pass
    values, errors = decode_records(payloads.to_pylist(), target)
    return values, errors if any(e is not None for e in errors) else None
