"""Typed records in the group resources and stream assets: the resource's format fields as a ``FormatConfig``, and
a run's decoding (its reader schemas resolved once, at its start, for every wave it carries on).

A run's failures are told apart here too: a registry that could not be asked retries the range with its bounds
without counting an attempt (as a launch that raised), a record that must stop its range parks it at once, and
anything else is a failed attempt as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import dagster as dg
from pydantic import ValidationError

from dagster_streamgroup.extras import require

if TYPE_CHECKING:
    from pyspark.sql import Column, SparkSession

    from dagster_streamgroup.dagster.resources import StreamGroupResource
    from dagster_streamgroup.formats.config import FormatConfig, ReaderSpec
    from dagster_streamgroup.formats.decoder import Readers
    from dagster_streamgroup.formats.spark import DecodedRecords

FORMAT_FIELDS = (
    "value_format",
    "key_format",
    "value_json_schema",
    "key_json_schema",
    "value_record_name",
    "key_record_name",
    "on_decode_error",
    "schema_registry_url",
    "schema_registry_basic_auth_user_info",
    "schema_registry_basic_auth_user_info_file",
    "schema_registry_bearer_token",
    "schema_registry_bearer_token_file",
    "schema_registry_ssl_ca_location",
    "schema_registry_ssl_certificate_location",
    "schema_registry_ssl_key_location",
    "schema_registry_timeout_s",
    "subject_name_strategy",
)

_REGISTRY_FIELDS = {
    "url": "schema_registry_url",
    "basic_auth_user_info": "schema_registry_basic_auth_user_info",
    "basic_auth_user_info_file": "schema_registry_basic_auth_user_info_file",
    "bearer_token": "schema_registry_bearer_token",
    "bearer_token_file": "schema_registry_bearer_token_file",
    "ssl_ca_location": "schema_registry_ssl_ca_location",
    "ssl_certificate_location": "schema_registry_ssl_certificate_location",
    "ssl_key_location": "schema_registry_ssl_key_location",
    "timeout_s": "schema_registry_timeout_s",
    "subject_name_strategy": "subject_name_strategy",
}
_COLUMN_FIELDS = {"format": "format", "json_schema": "json_schema", "record_name": "record_name"}


def _field_name(loc: tuple[Any, ...]) -> str:
    """A ``FormatConfig`` error location as the resource's field name."""
    if not loc:
        return ""
    head, rest = str(loc[0]), [str(p) for p in loc[1:]]
    if head == "registry" and rest:
        return _REGISTRY_FIELDS.get(rest[0], f"schema_registry_{rest[0]}")
    if head in ("key", "value") and rest:
        return f"{head}_{_COLUMN_FIELDS.get(rest[0], rest[0])}"
    return head


def _described(loc: tuple[Any, ...], message: str) -> str:
    """``where: message``, where a check across a block's fields names the field itself (``json_schema: ...``
    inside the value's block is the resource's ``value_json_schema``)."""
    where = _field_name(loc)
    head = str(loc[0]) if loc else ""
    named, sep, rest = message.partition(": ")
    if sep and len(loc) == 1 and head in ("key", "value", "registry") and " " not in named:
        inner = _field_name((head, named))
        return f"{inner}: {rest}"
    if not where or message.startswith(f"{where}:"):
        return message
    return f"{where}: {message}"


_STAND_INS = {
    "schema_registry_url": "http://unresolved-env-var",
    "schema_registry_basic_auth_user_info": "unresolved-env-var:unresolved-env-var",
}


def format_config(resource: StreamGroupResource, unresolved: frozenset[str] = frozenset()) -> FormatConfig:
    """``resource``'s format fields as a ``FormatConfig``; errors name the resource's fields, never a value.
    ``unresolved``: fields given as EnvVars not resolved yet (checked with stand-ins)."""
    from dagster_streamgroup.dagster.resources import StreamGroupConfigError
    from dagster_streamgroup.formats.config import FormatConfig

    if unresolved:
        stand_ins = {name: _STAND_INS.get(name, "unresolved-env-var") for name in unresolved}
        resource = _WithStandIns(resource, stand_ins)  # type: ignore[assignment]

    registry: dict[str, Any] | None = None
    if resource.schema_registry_url is not None:
        registry = {"url": resource.schema_registry_url}
        for key, name in _REGISTRY_FIELDS.items():
            value = getattr(resource, name)
            if value is not None and key != "url":
                registry[key] = value
    else:
        always_set = ("schema_registry_url", "schema_registry_timeout_s", "subject_name_strategy")
        stray = [n for n in _REGISTRY_FIELDS.values() if n not in always_set and getattr(resource, n) is not None]
        if stray:
            raise StreamGroupConfigError(f"{stray[0]}: set schema_registry_url too (the registry it belongs to)")
    data = {
        "key": {
            "format": resource.key_format,
            "json_schema": resource.key_json_schema,
            "record_name": resource.key_record_name,
        },
        "value": {
            "format": resource.value_format,
            "json_schema": resource.value_json_schema,
            "record_name": resource.value_record_name,
        },
        "registry": registry,
        "on_decode_error": resource.on_decode_error,
    }
    try:
        config = FormatConfig.model_validate(data)
    except ValidationError as exc:
        parts = []
        for err in exc.errors(include_input=False, include_url=False):
            parts.append(_described(tuple(err["loc"]), err["msg"].removeprefix("Value error, ")))
        raise StreamGroupConfigError("; ".join(parts)) from None
    if config.typed:
        require("fastavro", "formats", f"the typed records of group {resource.group!r}")
    if isinstance(resource.key_format, str) and resource.key_format != "bytes" and not hasattr(resource, "topics"):
        raise StreamGroupConfigError("key_format: a v3io record has no key to decode (its partition_key is a string)")
    return config


class _WithStandIns:
    """A resource's fields, with stand-ins for the EnvVars not resolved yet."""

    def __init__(self, resource: StreamGroupResource, stand_ins: Mapping[str, str]) -> None:
        self._resource = resource
        self._stand_ins = stand_ins

    def __getattr__(self, name: str) -> Any:
        if name in self._stand_ins:
            return self._stand_ins[name]
        return getattr(self._resource, name)


def default_decode_options(resource: StreamGroupResource) -> dict[str, str] | None:
    """The decode options of a read outside a run (``read_ranges`` called as it is): the subjects' latest schemas
    now; ``None`` for raw bytes."""
    config = resource.format_config()
    if not config.typed:
        return None
    from dagster_streamgroup.formats.decoder import resolve_readers
    from dagster_streamgroup.formats.spark import decode_options

    return decode_options(config, resolve_readers(config, resource.subject_topics()))


class RunDecoding:
    """A run's typed reads: its reader schemas, resolved at its first wave (``latest``: the latest version then)
    and kept for every wave it carries on, so its stream function sees one schema for the whole run."""

    def __init__(
        self, resource: StreamGroupResource, value_schema: ReaderSpec | None, key_schema: ReaderSpec | None
    ) -> None:
        self.resource = resource
        self.config = resource.format_config()
        self.value_schema = value_schema
        self.key_schema = key_schema
        self._readers: Readers | None = None

    @property
    def resolved(self) -> bool:
        return self._readers is not None

    def readers(self) -> Readers:
        if self._readers is None:
            from dagster_streamgroup.formats.decoder import resolve_readers

            self._readers = resolve_readers(
                self.config, self.resource.subject_topics(), self.value_schema, self.key_schema
            )
        return self._readers

    def describe(self) -> str:
        readers = self.readers()
        parts = [f"{name}: {r.describe()}" for name, r in (("value", readers.value), ("key", readers.key)) if r]
        return "; ".join(parts)

    def observed(
        self, spark: SparkSession, ranges: Mapping[str, tuple[int, int]], conditions: Mapping[str, Column]
    ) -> DecodedRecords:
        from dagster_streamgroup.formats.registry import SchemaSource
        from dagster_streamgroup.formats.spark import DecodedRecords, decode_options

        readers = self.readers()
        options = decode_options(self.config, readers)
        keep_raw = decode_options(self.config, readers, keep_raw=True)
        df = self.resource.read_ranges(spark, ranges, decode=options)
        return DecodedRecords(
            df,
            conditions,
            self.config.on_decode_error,
            self.resource.OFFSET_COLUMN,
            lambda again: self.resource.read_ranges(spark, again, decode=keep_raw),
            ranges,
            SchemaSource(self.config.registry) if self.config.registry is not None else None,
        )


def run_decoding(
    resource: StreamGroupResource, value_schema: ReaderSpec | None = None, key_schema: ReaderSpec | None = None
) -> RunDecoding | None:
    """The run's decoding, or ``None`` for raw bytes (a ``value_schema`` then is a mistake, said now)."""
    config = resource.format_config()
    if not config.typed:
        if value_schema is not None or key_schema is not None:
            raise dg.Failure(
                f"stream_asset: value_schema/key_schema given, but group {resource.group!r} reads raw bytes "
                "(value_format 'bytes'); set value_format on the resource"
            )
        return None
    return RunDecoding(resource, value_schema, key_schema)
