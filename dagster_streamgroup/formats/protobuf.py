"""Protobuf records into Arrow columns of the reader message's types.

Schemas come from the registry as serialized ``FileDescriptorProto`` (the ``serialized`` format confluent-kafka's
own deserializer asks for), their imports resolved through the registry as confluent-kafka resolves them. A record
is parsed with the reader's message class: Protobuf's own resolution (fields by number; a field the reader lacks
is skipped, one the writer lacks takes its default). The message indexes after the schema id must name, in the
writer's schema, a message of the reader's full name. Types, as spark-protobuf gives them: messages are structs,
``repeated`` lists, ``map`` maps, enums their symbol's name, ``google.protobuf.Timestamp`` a timestamp, 64-bit and
unsigned 32-bit integers longs, ``bytes`` binary. A scalar field without presence reads as its value (its
default when unset), as the generated classes give it.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa

from dagster_streamgroup.formats.registry import RegisteredText, SchemaSource
from dagster_streamgroup.formats.wire import read_message_indexes

TIMESTAMP = "google.protobuf.Timestamp"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class ProtoSchema:
    """A registered ``.proto`` file as descriptors."""

    file: Any
    """The ``FileDescriptor``."""

    def message(self, name: str | None) -> Any:
        """The message of full name ``name`` (the file's first message when ``None``)."""
        if name is None:
            if not self.file.message_types_by_name:
                raise ValueError(f"{self.file.name}: the schema declares no message")
            return next(iter(self.file.message_types_by_name.values()))
        found = _find(self.file, name)
        if found is None:
            raise ValueError(f"{self.file.name}: no message named {name!r}")
        return found

    def message_at(self, indexes: Sequence[int]) -> Any:
        """The message at a path of message indexes (the Confluent framing's)."""
        candidates = list(self.file.message_types_by_name.values())
        message = None
        for index in indexes:
            if index >= len(candidates):
                raise ValueError(f"message index path {list(indexes)} names no message of {self.file.name}")
            message = candidates[index]
            candidates = list(message.nested_types)
        if message is None:
            raise ValueError("an empty message index path")
        return message


def _find(file: Any, name: str) -> Any:
    def walk(messages: Sequence[Any]) -> Any:
        for message in messages:
            if message.full_name == name:
                return message
            found = walk(list(message.nested_types))
            if found is not None:
                return found
        return None

    return walk(list(file.message_types_by_name.values()))


def is_serialized(text: str) -> bool:
    """Whether a registered Protobuf schema is the base64 of a ``FileDescriptorProto`` (what confluent-kafka's
    Python serializer registers, and what registries answer in the ``serialized`` format), not ``.proto`` text."""
    import base64
    import binascii

    from google.protobuf import descriptor_pb2
    from google.protobuf.message import DecodeError

    try:
        data = base64.b64decode(text.encode("ascii"), validate=True)
        descriptor_pb2.FileDescriptorProto.FromString(data)
    except (binascii.Error, ValueError, UnicodeEncodeError, DecodeError):
        return False
    return bool(data)


def serialized(registered: RegisteredText, source: SchemaSource, subject: str | None = None) -> RegisteredText:
    """``registered`` as a serialized descriptor: as it is when it already is one (a registry may keep what a Python
    producer registered, and refuse to convert it again), else asked of the registry in that format."""
    if is_serialized(registered.text):
        return registered
    if subject is not None and registered.version is not None:
        return source.version(subject, registered.version, serialized=True)
    return source.by_id(registered.schema_id, serialized=True)


def load(registered: RegisteredText, source: SchemaSource) -> ProtoSchema:
    """The descriptors of a schema in the ``serialized`` form (``serialized``), its references resolved."""
    from confluent_kafka.schema_registry import Schema, SchemaReference
    from confluent_kafka.schema_registry._sync.protobuf import _resolve_named_schema
    from confluent_kafka.schema_registry.common.protobuf import _init_pool, _str_to_proto
    from google.protobuf import descriptor_pool

    pool = descriptor_pool.DescriptorPool()
    _init_pool(pool)
    schema = Schema(
        registered.text,
        "PROTOBUF",
        [SchemaReference(name, subject, version) for name, subject, version in registered.references],
    )
    _resolve_named_schema(schema, source.client(), pool)
    proto = _str_to_proto(f"streamgroup-{registered.schema_id}.proto", registered.text)
    return ProtoSchema(pool.Add(proto))


def arrow_type(message: Any, depth: int = 0) -> pa.DataType:
    """The Arrow type of a message (a struct of its fields)."""
    if message.full_name == TIMESTAMP:
        return pa.timestamp("us", tz="UTC")
    if depth > 32:
        raise ValueError(f"message {message.full_name} is recursive; it has no Spark type")
    return pa.struct([pa.field(f.name, _field_type(f, depth)) for f in message.fields])


def _is_map(field: Any) -> bool:
    return bool(field.message_type is not None and field.message_type.GetOptions().map_entry)


def _repeated(field: Any) -> bool:
    flag = getattr(field, "is_repeated", None)  # protobuf 6 (``label`` is deprecated there)
    if flag is not None:
        return bool(flag() if callable(flag) else flag)
    return bool(field.label == field.LABEL_REPEATED)


def _scalar_type(field: Any, depth: int) -> pa.DataType:
    from google.protobuf.descriptor import FieldDescriptor as F

    if field.type in (F.TYPE_MESSAGE, F.TYPE_GROUP):
        return arrow_type(field.message_type, depth + 1)
    if field.type == F.TYPE_ENUM:
        return pa.string()
    types = {
        F.TYPE_INT32: pa.int32(),
        F.TYPE_SINT32: pa.int32(),
        F.TYPE_SFIXED32: pa.int32(),
        F.TYPE_UINT32: pa.int64(),
        F.TYPE_FIXED32: pa.int64(),
        F.TYPE_INT64: pa.int64(),
        F.TYPE_SINT64: pa.int64(),
        F.TYPE_SFIXED64: pa.int64(),
        F.TYPE_UINT64: pa.int64(),
        F.TYPE_FIXED64: pa.int64(),
        F.TYPE_BOOL: pa.bool_(),
        F.TYPE_FLOAT: pa.float32(),
        F.TYPE_DOUBLE: pa.float64(),
        F.TYPE_STRING: pa.string(),
        F.TYPE_BYTES: pa.binary(),
    }
    return types[field.type]


def _field_type(field: Any, depth: int) -> pa.DataType:
    if _is_map(field):
        entry = field.message_type
        return pa.map_(
            _scalar_type(entry.fields_by_name["key"], depth), _scalar_type(entry.fields_by_name["value"], depth)
        )
    if _repeated(field):
        return pa.list_(_scalar_type(field, depth))
    return _scalar_type(field, depth)


_WIRE = {
    "varint": {"int32", "int64", "uint32", "uint64", "bool", "enum"},
    "zigzag32": {"sint32"},
    "zigzag64": {"sint64"},
    "fixed32": {"fixed32", "sfixed32", "float"},
    "fixed64": {"fixed64", "sfixed64", "double"},
    "delimited": {"string", "bytes", "message", "group"},
}


def _wire(field: Any) -> str:
    from google.protobuf.descriptor import FieldDescriptor as F

    names = {v: k.removeprefix("TYPE_").lower() for k, v in vars(F).items() if k.startswith("TYPE_")}
    kind = str(names[field.type])
    for wire, kinds in _WIRE.items():
        if kind in kinds:
            return wire
    return kind


def incompatibility(writer: Any, reader: Any, path: str = "") -> str | None:
    """Why records of message ``writer`` cannot be read as ``reader`` (a field number both have, with types of
    different wire encodings, or a message against a scalar), naming the field; ``None`` when they can."""
    for field in reader.fields:
        theirs = writer.fields_by_number.get(field.number)
        if theirs is None:
            continue
        name = f"{path}{field.name}"
        if _wire(theirs) != _wire(field) or _is_map(theirs) != _is_map(field):
            return (
                f"field {name} (number {field.number}): the writer's {_describe(theirs)} cannot be read as "
                f"{_describe(field)}"
            )
        if (
            field.message_type is not None
            and theirs.message_type is not None
            and not _is_map(field)
            and field.message_type.full_name != theirs.message_type.full_name
            and path.count(".") < 32
        ):
            found = incompatibility(theirs.message_type, field.message_type, f"{name}.")
            if found is not None:
                return found
    return None


def _describe(field: Any) -> str:
    kind = _wire(field)
    return f"{field.message_type.full_name if field.message_type is not None else kind} ({kind})"


def _to_python(message: Any, descriptor: Any) -> Any:
    if descriptor.full_name == TIMESTAMP:
        return _EPOCH + timedelta(seconds=message.seconds, microseconds=message.nanos // 1000)
    out: dict[str, Any] = {}
    for field in descriptor.fields:
        value = getattr(message, field.name)
        if _is_map(field):
            value_field = field.message_type.fields_by_name["value"]
            out[field.name] = [(k, _value(v, value_field)) for k, v in value.items()]
        elif _repeated(field):
            out[field.name] = [_value(v, field) for v in value]
        elif field.message_type is not None:
            out[field.name] = _value(value, field) if message.HasField(field.name) else None
        elif field.has_presence and not message.HasField(field.name):
            out[field.name] = None
        else:
            out[field.name] = _value(value, field)
    return out


def _value(value: Any, field: Any) -> Any:
    if field.message_type is not None:
        return _to_python(value, field.message_type)
    if field.enum_type is not None:
        symbol = field.enum_type.values_by_number.get(value)
        return symbol.name if symbol is not None else str(value)
    return value


def message_class(descriptor: Any) -> Callable[[bytes], Any]:
    from google.protobuf import message_factory

    cls = message_factory.GetMessageClass(descriptor)
    return cls.FromString  # type: ignore[no-any-return]


def decode(
    framed: Sequence[bytes | None],
    writer: ProtoSchema,
    reader: Any,
    parse: Callable[[bytes], Any],
) -> tuple[pa.Array, list[str | None] | None]:
    """Framed records of one writer schema (the 5-byte header still on) as values of message ``reader``: parsed
    record by record, then built into Arrow column by column (a scalar field is one ``getattr`` a record, in C)."""
    target = arrow_type(reader)
    messages: list[Any] = []
    errors: list[str | None] = []
    paths: dict[tuple[int, ...], str] = {}
    for record in framed:
        if record is None:
            messages.append(None)
            errors.append(None)
            continue
        try:
            # The first message's path is a single 0 byte: the common case, read without a varint.
            indexes, start = ([0], 6) if record[5:6] == b"\x00" else read_message_indexes(record, 5)
            key = tuple(indexes)
            name = paths.get(key)
            if name is None:
                name = paths[key] = writer.message_at(indexes).full_name
            if name != reader.full_name:
                raise ValueError(f"the record is a {name}, the reader reads {reader.full_name}")
            messages.append(parse(record[start:]))
        except Exception as exc:
            messages.append(None)
            errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
            continue
        errors.append(None)
    return _columns(messages, reader, target), errors if any(e is not None for e in errors) else None


def _columns(messages: Sequence[Any], descriptor: Any, target: pa.DataType) -> pa.Array:
    """Parsed messages (``None`` for a record that failed) as one struct array of the reader's type."""
    if descriptor.full_name == TIMESTAMP:
        return pa.array([None if m is None else _to_python(m, descriptor) for m in messages], target)
    present = [m for m in messages if m is not None]
    mask = None if len(present) == len(messages) else pa.array([m is None for m in messages])
    positions = None if mask is None else _positions(messages)
    children = []
    for field, arrow_field in zip(descriptor.fields, target, strict=True):
        values = list(map(operator.attrgetter(field.name), present))
        if _is_map(field):
            value_field = field.message_type.fields_by_name["value"]
            values = [[(k, _value(v, value_field)) for k, v in value.items()] for value in values]
        elif _repeated(field):
            values = [[_value(v, field) for v in value] for value in values]
        elif field.message_type is not None:
            values = [
                _value(v, field) if m.HasField(field.name) else None for v, m in zip(values, present, strict=True)
            ]
        elif field.enum_type is not None:
            names = {number: value.name for number, value in field.enum_type.values_by_number.items()}
            values = [names.get(v, str(v)) for v in values]
        elif field.has_presence:
            values = [v if m.HasField(field.name) else None for v, m in zip(values, present, strict=True)]
        column = pa.array(values, arrow_field.type)
        if positions is not None:  # the failed records' rows, null, back in their places
            column = column.take(positions)
        children.append(column)
    return pa.StructArray.from_arrays(children, fields=list(target), mask=mask)


def _positions(messages: Sequence[Any]) -> pa.Array:
    """Where each record's value is among the parsed messages' (null for a record that failed)."""
    positions = []
    k = 0
    for message in messages:
        positions.append(None if message is None else k)
        k += message is not None
    return pa.array(positions, pa.int64())
