"""Batches of raw records into typed ones: the work the range readers do in Spark's tasks.

A ``RecordDecoder`` replaces a batch's binary key and value columns with the reader schemas' typed columns, and adds
``keySchemaId`` and ``valueSchemaId`` (the writer's schema id of each record, null where it has none) and
``decodeError`` (why a record did not decode, null when it did). It never drops a record and never raises for
one: what becomes of a bad record is the run's decision (``DecodeErrorPolicy``, applied by ``formats.spark``). It
raises only when the registry cannot be asked (``RegistryUnavailableError``: the range is retried with its bounds).

The reader schemas are resolved once, in the run's driver (``resolve_readers``: ``latest`` means the latest version
at the run's start), and travel to the tasks with the writer schemas the driver already holds, so that every task
of a run and every carried-on wave decodes into the same columns.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from dagster_streamgroup.formats import avro, jsonschema, protobuf
from dagster_streamgroup.formats.config import ColumnFormat, FormatConfig, ReaderSpec, RecordFormat, subject_for
from dagster_streamgroup.formats.registry import RegisteredText, SchemaSource, UnknownSchemaError
from dagster_streamgroup.formats.wire import binary_column, header_error, parse_frames

KEY_ID_COLUMN = "keySchemaId"
VALUE_ID_COLUMN = "valueSchemaId"
ERROR_COLUMN = "decodeError"
UNRESOLVABLE = "writer schema cannot be resolved"
"""Part of the error of a record whose writer schema the reader schema cannot resolve (the range is parked)."""


@dataclass(frozen=True)
class ReaderSchema:
    """The schema a column is decoded into for a whole run."""

    format: RecordFormat
    text: str | None = None
    """Avro, JSON Schema: the schema's JSON; Protobuf: the base64 of its serialized ``FileDescriptorProto``."""
    schema_id: int | None = None
    subject: str | None = None
    version: int | None = None
    record_name: str | None = None
    """Protobuf: the message's full name (the file's first message when none)."""
    references: tuple[tuple[str, str, int], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "format": self.format.value,
            "text": self.text,
            "schema_id": self.schema_id,
            "subject": self.subject,
            "version": self.version,
            "record_name": self.record_name,
            "references": [list(r) for r in self.references],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ReaderSchema:
        return cls(
            format=RecordFormat(data["format"]),
            text=data.get("text"),
            schema_id=data.get("schema_id"),
            subject=data.get("subject"),
            version=data.get("version"),
            record_name=data.get("record_name"),
            references=tuple((str(n), str(s), int(v)) for n, s, v in data.get("references", [])),
        )

    def describe(self) -> str:
        where = f"subject {self.subject!r} version {self.version}, id {self.schema_id}" if self.subject else "given"
        return f"{self.format.value} reader schema ({where})"


@dataclass(frozen=True)
class Readers:
    """The reader schemas of a run: its key's and its value's (``None``: the column stays binary)."""

    key: ReaderSchema | None = None
    value: ReaderSchema | None = None

    def to_json(self) -> str:
        return json.dumps(
            {"key": self.key.to_json() if self.key else None, "value": self.value.to_json() if self.value else None}
        )

    @classmethod
    def from_json(cls, text: str) -> Readers:
        data = json.loads(text)
        return cls(
            key=ReaderSchema.from_json(data["key"]) if data.get("key") else None,
            value=ReaderSchema.from_json(data["value"]) if data.get("value") else None,
        )


def _given_text(spec: ReaderSpec) -> str | None:
    if isinstance(spec, Mapping):
        return json.dumps(dict(spec))
    if isinstance(spec, str) and spec != "latest":
        return spec
    return None


def resolve_reader(
    column: ColumnFormat,
    config: FormatConfig,
    topics: Sequence[str],
    spec: ReaderSpec | None,
    *,
    is_key: bool,
    source: SchemaSource | None = None,
) -> ReaderSchema | None:
    """The reader schema of one column for a run: the registry's latest (or given) version of the column's
    subject, or a schema given as text; for ``json`` the configured JSON Schema."""
    fmt = column.format
    name = "key_schema" if is_key else "value_schema"
    if fmt is RecordFormat.BYTES:
        return None
    if fmt is RecordFormat.STRING:
        return ReaderSchema(fmt)
    if fmt is RecordFormat.JSON:
        assert column.json_schema is not None
        jsonschema.parse(column.json_schema)
        return ReaderSchema(fmt, text=column.json_schema)
    given = _given_text(spec) if spec is not None else None
    if given is not None:
        if fmt is RecordFormat.PROTOBUF:
            raise ValueError(f"{name}: a Protobuf reader schema is a registry version ('latest' or a number)")
        parsed = avro.parse(given) if fmt is RecordFormat.AVRO else jsonschema.parse(given)
        record = avro.full_name(parsed) if fmt is RecordFormat.AVRO else None
        return ReaderSchema(fmt, text=given, record_name=record or column.record_name)
    assert config.registry is not None
    source = source or SchemaSource(config.registry)
    if spec in (None, "latest"):
        version: int | Literal["latest"] = "latest"
    elif isinstance(spec, int) and not isinstance(spec, bool) and spec > 0:
        version = spec
    else:
        raise ValueError(f"{name}: must be 'latest', a version number or a schema, got {spec!r}")
    subject = subject_for(config.registry.subject_name_strategy, sorted(topics)[0], column.record_name, is_key=is_key)
    registered = source.version(subject, version)
    if fmt is RecordFormat.PROTOBUF and registered.schema_type == "PROTOBUF":
        found = protobuf.serialized(registered, source, subject)
        registered = RegisteredText(
            registered.schema_id, "PROTOBUF", found.text, registered.references, registered.subject, registered.version
        )
    expected = {RecordFormat.AVRO: "AVRO", RecordFormat.PROTOBUF: "PROTOBUF", RecordFormat.JSON_SCHEMA: "JSON"}[fmt]
    if registered.schema_type != expected:
        raise ValueError(
            f"{name}: subject {subject!r} version {registered.version} is a {registered.schema_type} schema, "
            f"the format is {fmt.value!r}"
        )
    return ReaderSchema(
        fmt,
        text=registered.text,
        schema_id=registered.schema_id,
        subject=subject,
        version=registered.version,
        record_name=column.record_name,
        references=registered.references,
    )


def resolve_readers(
    config: FormatConfig,
    topics: Sequence[str],
    value_schema: ReaderSpec | None = None,
    key_schema: ReaderSpec | None = None,
) -> Readers:
    source = SchemaSource(config.registry) if config.registry is not None else None
    return Readers(
        key=resolve_reader(config.key, config, topics, key_schema, is_key=True, source=source),
        value=resolve_reader(config.value, config, topics, value_schema, is_key=False, source=source),
    )


@dataclass
class ColumnDecoder:
    """One column of raw records into the reader schema's values."""

    reader: ReaderSchema | None
    source: SchemaSource | None
    label: str
    """``key`` or ``value``: how errors name the column."""
    tombstones_are_errors: bool
    _avro_reader: Any = None
    _json_reader: Any = None
    _proto_reader: Any = None
    _proto_parse: Callable[[bytes], Any] | None = None
    _writers: dict[int, tuple[Any, str | None]] = field(default_factory=dict)
    """Writer schema id -> (what decodes with it, why the reader cannot resolve it)."""

    def __post_init__(self) -> None:
        reader = self.reader
        if reader is None:
            return
        if reader.format is RecordFormat.AVRO:
            assert reader.text is not None
            self._avro_reader = avro.parse(reader.text)
        elif reader.format in (RecordFormat.JSON, RecordFormat.JSON_SCHEMA):
            assert reader.text is not None
            self._json_reader = jsonschema.parse(reader.text)
        elif reader.format is RecordFormat.PROTOBUF:
            assert reader.text is not None and self.source is not None and reader.schema_id is not None
            registered = RegisteredText(reader.schema_id, "PROTOBUF", reader.text, reader.references)
            self._proto_reader = protobuf.load(registered, self.source).message(reader.record_name)
            self._proto_parse = protobuf.message_class(self._proto_reader)

    @property
    def arrow_type(self) -> pa.DataType:
        reader = self.reader
        if reader is None:
            return pa.binary()
        if reader.format is RecordFormat.STRING:
            return pa.string()
        if self._avro_reader is not None:
            return avro.arrow_type(self._avro_reader)
        if self._json_reader is not None:
            return jsonschema.arrow_type(self._json_reader)
        return protobuf.arrow_type(self._proto_reader)

    def decode(self, column: pa.Array) -> tuple[pa.Array, pa.Array, list[str | None] | None]:
        """(values, writer schema ids, each record's error or ``None`` when none failed)."""
        raw = binary_column(column)
        n = len(raw)
        no_ids = pa.nulls(n, pa.int32())
        reader = self.reader
        if reader is None:
            return raw, no_ids, None
        if reader.format is RecordFormat.STRING:
            return self._decode_strings(raw), no_ids, self._tombstones(raw)
        if reader.format is RecordFormat.JSON:
            values, errors = jsonschema.decode(raw, self.arrow_type) if n else (pa.nulls(0, self.arrow_type), None)
            return values, no_ids, self._merge(self._tombstones(raw), errors, "payload does not decode")
        return self._decode_framed(raw)

    def _decode_strings(self, raw: pa.BinaryArray) -> pa.Array:
        try:
            return raw.cast(pa.string())
        except pa.ArrowInvalid:
            values = []
            for item in raw.to_pylist():
                try:
                    values.append(None if item is None else item.decode("utf-8"))
                except UnicodeDecodeError:
                    values.append(None)
            return pa.array(values, pa.string())

    def _tombstones(self, raw: pa.BinaryArray) -> list[str | None] | None:
        if not self.tombstones_are_errors or not raw.null_count:
            return None
        return [f"{self.label}: null (a tombstone)" if v is None else None for v in raw.is_null().to_pylist()]

    def _merge(
        self, first: list[str | None] | None, second: list[str | None] | None, what: str
    ) -> list[str | None] | None:
        if second is not None:
            second = [None if e is None else f"{self.label}: {what}: {e}" for e in second]
        if first is None:
            return second
        if second is None:
            return first
        return [a or b for a, b in zip(first, second, strict=True)]

    def _writer(self, schema_id: int) -> tuple[Any, str | None]:
        """What decodes records of writer ``schema_id`` and why the reader cannot resolve it (``None``: it can);
        ``UnknownSchemaError`` when the registry does not know the id."""
        held = self._writers.get(schema_id)
        if held is not None:
            return held
        reader = self.reader
        assert reader is not None and self.source is not None
        if reader.format is RecordFormat.AVRO:
            registered = self.source.by_id(schema_id)
            if registered.schema_type != "AVRO":
                found: tuple[Any, str | None] = (None, f"schema id {schema_id} is {registered.schema_type}, not AVRO")
            else:
                writer = avro.parse(registered.text)
                problem = avro.incompatibility(writer, self._avro_reader)
                found = ((registered.text, writer), problem)
        elif reader.format is RecordFormat.JSON_SCHEMA:
            registered = self.source.by_id(schema_id)
            problem = None if registered.schema_type == "JSON" else f"schema id {schema_id} is {registered.schema_type}"
            found = (None, problem)
        else:
            registered = self.source.by_id(schema_id)
            if registered.schema_type == "PROTOBUF":
                registered = protobuf.serialized(registered, self.source)
            if registered.schema_type != "PROTOBUF":
                found = (None, f"schema id {schema_id} is {registered.schema_type}, not PROTOBUF")
            else:
                writer_schema = protobuf.load(registered, self.source)
                problem = None
                try:
                    writer_message = writer_schema.message(self._proto_reader.full_name)
                    problem = protobuf.incompatibility(writer_message, self._proto_reader)
                except ValueError:
                    problem = None  # records of other messages are told apart record by record
                found = (writer_schema, problem)
        self._writers[schema_id] = found
        return found

    def _unresolvable(self, schema_id: int, problem: str) -> str:
        reader = self.reader
        assert reader is not None
        subject = reader.subject or "(a given reader schema)"
        return (
            f"{self.label}: {UNRESOLVABLE}: subject {subject}, writer schema id {schema_id}, reader schema id "
            f"{reader.schema_id if reader.schema_id is not None else '(given)'}: {problem}"
        )

    def _decode_framed(self, raw: pa.BinaryArray) -> tuple[pa.Array, pa.Array, list[str | None] | None]:
        frames = parse_frames(raw)
        n = len(raw)
        target = self.arrow_type
        ids = frames.schema_ids
        id_column = pa.array(np.where(ids >= 0, ids, 0).astype(np.int32), pa.int32(), mask=ids < 0)
        errors: list[str | None] | None = None

        def fail(indexes: Sequence[int] | np.ndarray[Any, Any], text: str | None = None) -> None:
            nonlocal errors
            if errors is None:
                errors = [None] * n
            for i in indexes:
                errors[int(i)] = text if text is not None else f"{self.label}: {header_error(frames, int(i))}"

        unframed = np.flatnonzero(ids < 0)
        if len(unframed):
            if not self.tombstones_are_errors:
                unframed = unframed[~frames.nulls[unframed]]
            fail(unframed)
        pieces: list[pa.Array] = []
        positions: list[np.ndarray[Any, Any]] = []
        for schema_id in np.unique(ids[ids >= 0]).tolist():
            where = np.flatnonzero(ids == schema_id)
            try:
                writer, problem = self._writer(schema_id)
            except UnknownSchemaError:
                fail(where, f"{self.label}: schema id {schema_id} is unknown to the registry")
                continue
            if problem is not None:
                fail(where, self._unresolvable(schema_id, problem))
                continue
            values, group_errors = self._decode_group(frames.payloads, raw, where, writer)
            if group_errors is not None:
                prefix = f"{self.label}: payload does not decode with writer schema id {schema_id}: "
                for k, error in enumerate(group_errors):
                    if error is not None:
                        fail([where[k]], prefix + error)
            pieces.append(values)
            positions.append(where)
        decoded = sum(len(p) for p in positions)
        if decoded == n and len(pieces) == 1:
            return pieces[0], id_column, errors
        placed = np.concatenate(positions) if positions else np.zeros(0, np.int64)
        missing = np.setdiff1d(np.arange(n), placed, assume_unique=True)
        everything = pa.concat_arrays([*pieces, pa.nulls(len(missing), target)]) if n else pa.nulls(0, target)
        order = np.concatenate([placed, missing]).astype(np.int64)
        inverse = np.empty(n, dtype=np.int64)
        inverse[order] = np.arange(n, dtype=np.int64)
        return everything.take(pa.array(inverse)), id_column, errors

    def _decode_group(
        self, payloads: pa.BinaryArray, raw: pa.BinaryArray, where: np.ndarray[Any, Any], writer: Any
    ) -> tuple[pa.Array, list[str | None] | None]:
        reader = self.reader
        assert reader is not None
        indices = pa.array(where)
        if reader.format is RecordFormat.AVRO:
            text, parsed = writer
            group = payloads if len(where) == len(payloads) else payloads.take(indices)
            return avro.decode(group, text, parsed, self._avro_reader)
        if reader.format is RecordFormat.JSON_SCHEMA:
            group = payloads if len(where) == len(payloads) else payloads.take(indices)
            return jsonschema.decode(group, self.arrow_type)
        assert self._proto_parse is not None
        framed = raw.take(indices).to_pylist()
        return protobuf.decode(framed, writer, self._proto_reader, self._proto_parse)


class RecordDecoder:
    """A batch's key and value columns decoded, with the writer schema ids and each record's error."""

    def __init__(
        self,
        readers: Readers,
        config: FormatConfig,
        *,
        value_column: str = "value",
        key_column: str | None = "key",
        writer_schemas: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        source = SchemaSource(config.registry) if config.registry is not None else None
        if source is not None and writer_schemas:
            source.seed(writer_schemas)
        self.source = source
        self.value_column = value_column
        self.key_column = key_column
        self.value = ColumnDecoder(readers.value, source, "value", tombstones_are_errors=readers.value is not None)
        self.key = ColumnDecoder(readers.key, source, "key", tombstones_are_errors=False) if key_column else None

    def output_schema(self, base: pa.Schema) -> pa.Schema:
        """``base`` (the reader's raw schema) with the typed columns and the three added ones."""
        fields = []
        for f in base:
            if f.name == self.value_column:
                fields.append(pa.field(f.name, self.value.arrow_type))
            elif self.key is not None and f.name == self.key_column:
                fields.append(pa.field(f.name, self.key.arrow_type))
            else:
                fields.append(f)
        if self.key is not None:
            fields.append(pa.field(KEY_ID_COLUMN, pa.int32()))
        fields += [pa.field(VALUE_ID_COLUMN, pa.int32()), pa.field(ERROR_COLUMN, pa.string())]
        return pa.schema(fields)

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        schema = self.output_schema(batch.schema)
        columns = []
        errors: list[str | None] | None = None
        value_ids = key_ids = None
        for name in batch.schema.names:
            column = batch.column(name)
            if name == self.value_column:
                column, value_ids, errors_v = self.value.decode(column)
                errors = _first_errors(errors, errors_v)
            elif self.key is not None and name == self.key_column:
                column, key_ids, errors_k = self.key.decode(column)
                errors = _first_errors(errors_k, errors)
            columns.append(column)
        n = batch.num_rows
        if self.key is not None:
            columns.append(key_ids if key_ids is not None else pa.nulls(n, pa.int32()))
        columns.append(value_ids if value_ids is not None else pa.nulls(n, pa.int32()))
        columns.append(pa.array(errors, pa.string()) if errors is not None else pa.nulls(n, pa.string()))
        return pa.RecordBatch.from_arrays(columns, schema=schema)


def _first_errors(first: list[str | None] | None, second: list[str | None] | None) -> list[str | None] | None:
    if first is None:
        return second
    if second is None:
        return first
    return [a or b for a, b in zip(first, second, strict=True)]


def raw_bytes_text(data: bytes | None) -> str | None:
    """Raw bytes as the dead letters keep them (base64)."""
    return None if data is None else base64.b64encode(data).decode("ascii")
