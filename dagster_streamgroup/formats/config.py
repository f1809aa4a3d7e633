"""What a stream's records are and where their schemas live: the formats of keys and values, the Schema Registry
connection, the subject name strategy and the decode-error policy.

Pure configuration (pydantic, no I/O): the group resources build it from their fields, and the Spark sources carry
it to their tasks as options (``to_options`` / ``from_options``). Secrets (the registry's basic-auth user info and
bearer token) are ``SecretStr`` and travel either as files (``*_file``, read where they are used) or as options whose
names Spark's redaction covers; they never reach an error, a repr or a log line.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator


class RecordFormat(StrEnum):
    """How a key or a value is encoded."""

    BYTES = "bytes"
    """As they are (Spark's Kafka schema): the default."""
    STRING = "string"
    """UTF-8 text."""
    JSON = "json"
    """JSON text without a registry, decoded into the columns of a given JSON Schema."""
    AVRO = "avro"
    """Avro in the Confluent wire format, writer schemas in the registry."""
    PROTOBUF = "protobuf"
    """Protobuf in the Confluent wire format (message indexes after the schema id), schemas in the registry."""
    JSON_SCHEMA = "json_schema"
    """JSON in the Confluent wire format, JSON Schemas in the registry."""

    @property
    def registered(self) -> bool:
        """Whether records carry the Confluent framing and their schemas live in the registry."""
        return self in {RecordFormat.AVRO, RecordFormat.PROTOBUF, RecordFormat.JSON_SCHEMA}


class SubjectNameStrategy(StrEnum):
    """Where a record's schema is registered (Confluent's strategies of the same names)."""

    TOPIC = "TopicNameStrategy"
    """``<topic>-value`` / ``<topic>-key``."""
    RECORD = "RecordNameStrategy"
    """The record's fully qualified name."""
    TOPIC_RECORD = "TopicRecordNameStrategy"
    """``<topic>-<record's fully qualified name>``."""


class DecodeErrorPolicy(StrEnum):
    """What becomes of a record that cannot be decoded (no magic byte, a schema id the registry does not know, a
    payload that does not decode, a tombstone where a value is expected)."""

    FAIL = "fail"
    """The range is parked with an event naming the record; nothing of it is committed (the default)."""
    DEAD_LETTER = "dead_letter"
    """The record's coordinates, raw bytes and error go to the group's dead letters; the rest is processed."""
    NULL = "null"
    """The record reaches the stream function with a null value and the error in ``decodeError``."""


SECRET_OPTION_NAMES = ("registry.basic.auth.secret", "registry.bearer.auth.token")
"""The source options that carry the registry's secrets: named so that Spark's own redaction pattern
(``spark.redaction.regex``: secret, token) and the sessions' string redaction
(``spark.redaction.SECRET_REDACTION_REGEX``) hide them."""


class RegistryConfig(BaseModel):
    """A Schema Registry that speaks Confluent's REST API (Confluent's, Apicurio's ``/apis/ccompat/v7``, ...)."""

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    url: str = Field(description="The registry's URL, or several, comma-separated (tried in order).")
    basic_auth_user_info: SecretStr | None = Field(default=None, repr=False, description="USER:PASSWORD.")
    basic_auth_user_info_file: Path | None = Field(default=None, description="A file holding USER:PASSWORD.")
    bearer_token: SecretStr | None = Field(default=None, repr=False, description="A static bearer token.")
    bearer_token_file: Path | None = Field(default=None, description="A file holding the bearer token.")
    bearer_logical_cluster: str | None = Field(default=None, description="Confluent Cloud's logical cluster id.")
    ssl_ca_location: str | None = None
    ssl_certificate_location: str | None = None
    ssl_key_location: str | None = None
    timeout_s: float = Field(default=10.0, gt=0, description="Seconds a registry request may take.")
    subject_name_strategy: SubjectNameStrategy = SubjectNameStrategy.TOPIC

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        urls = [u.strip() for u in value.split(",") if u.strip()]
        if not urls:
            raise ValueError("must name at least one registry URL")
        for url in urls:
            parts = urlsplit(url)
            if parts.scheme not in {"http", "https"} or not parts.hostname:
                raise ValueError(f"{parts.scheme + '://' if parts.scheme else ''}... is not an http(s)://HOST URL")
            if parts.username is not None or parts.password is not None:
                raise ValueError(
                    "holds credentials; give them as basic_auth_user_info (an EnvVar) or basic_auth_user_info_file"
                )
        return ",".join(urls)

    @model_validator(mode="after")
    def _check_auth(self) -> RegistryConfig:
        if self.basic_auth_user_info is not None and self.basic_auth_user_info_file is not None:
            raise ValueError("basic_auth_user_info: give it or basic_auth_user_info_file, not both")
        if self.bearer_token is not None and self.bearer_token_file is not None:
            raise ValueError("bearer_token: give it or bearer_token_file, not both")
        basic = self.basic_auth_user_info is not None or self.basic_auth_user_info_file is not None
        bearer = self.bearer_token is not None or self.bearer_token_file is not None
        if basic and bearer:
            raise ValueError("basic_auth_user_info: a registry takes basic auth or a bearer token, not both")
        if self.basic_auth_user_info is not None and ":" not in self.basic_auth_user_info.get_secret_value():
            raise ValueError("basic_auth_user_info: must be USER:PASSWORD")
        if self.ssl_key_location is not None and self.ssl_certificate_location is None:
            raise ValueError("ssl_key_location: needs ssl_certificate_location")
        return self

    @property
    def shown_url(self) -> str:
        """The URLs as errors and logs may show them (they hold no credentials: ``url`` refuses any)."""
        return self.url

    def user_info(self) -> str | None:
        """USER:PASSWORD, read from its file now when it is one (a rotated file takes effect at once)."""
        if self.basic_auth_user_info is not None:
            return self.basic_auth_user_info.get_secret_value()
        if self.basic_auth_user_info_file is not None:
            return _read_secret(self.basic_auth_user_info_file, "basic_auth_user_info_file")
        return None

    def token(self) -> str | None:
        if self.bearer_token is not None:
            return self.bearer_token.get_secret_value()
        if self.bearer_token_file is not None:
            return _read_secret(self.bearer_token_file, "bearer_token_file")
        return None

    def client_config(self) -> dict[str, Any]:
        """confluent-kafka's ``SchemaRegistryClient`` configuration (secrets included: for the client only)."""
        conf: dict[str, Any] = {
            "url": self.url,
            "timeout": self.timeout_s,
            "max.retries": 1,
            "retries.wait.ms": 200,
            "retries.max.wait.ms": 1000,
        }
        user_info = self.user_info()
        if user_info is not None:
            conf["basic.auth.user.info"] = user_info
        token = self.token()
        if token is not None:
            conf["bearer.auth.credentials.source"] = "STATIC_TOKEN"
            conf["bearer.auth.token"] = token
            conf["bearer.auth.logical.cluster"] = self.bearer_logical_cluster or ""
        for key, value in (
            ("ssl.ca.location", self.ssl_ca_location),
            ("ssl.certificate.location", self.ssl_certificate_location),
            ("ssl.key.location", self.ssl_key_location),
        ):
            if value is not None:
                conf[key] = value
        return conf

    def identity(self) -> str:
        """What tells two registries apart, without secrets: the key of the schema cache."""
        return self.url

    def credentials_fingerprint(self) -> str:
        """Secrets as resolved now (for a client cache that must rebuild a client after a rotation)."""
        return f"{self.user_info() or ''}\0{self.token() or ''}"


def _read_secret(path: Path, field: str) -> str:
    try:
        text = path.read_text().strip()
    except OSError as exc:
        raise ValueError(f"{field}: cannot read {path} ({exc.strerror or type(exc).__name__})") from None
    if not text:
        raise ValueError(f"{field}: {path} is empty")
    return text


class ColumnFormat(BaseModel):
    """How one column (a key or a value) is decoded."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: RecordFormat = RecordFormat.BYTES
    json_schema: str | None = Field(
        default=None, description="With format 'json': the JSON Schema (a JSON object as text) of the records."
    )
    record_name: str | None = Field(
        default=None,
        description="The fully qualified record (message) name, for RecordNameStrategy and TopicRecordNameStrategy.",
    )

    @model_validator(mode="after")
    def _check(self) -> ColumnFormat:
        if self.format is RecordFormat.JSON:
            if self.json_schema is None:
                raise ValueError("json_schema: format 'json' needs the records' JSON Schema")
            try:
                parsed = json.loads(self.json_schema)
            except ValueError as exc:
                raise ValueError(f"json_schema: not JSON ({exc})") from None
            if not isinstance(parsed, dict):
                raise ValueError("json_schema: must be a JSON object (a JSON Schema)")
        elif self.json_schema is not None:
            raise ValueError(f"json_schema: only for format 'json', the format is {self.format.value!r}")
        return self


ReaderSpec = Literal["latest"] | int | str | Mapping[str, Any]
"""A reader schema: ``latest`` (the subject's latest version at the run's start), a version number, or a schema
(Avro or JSON Schema as JSON text or a dict; Protobuf as ``.proto`` text)."""


class FormatConfig(BaseModel):
    """The formats of a stream's keys and values, their registry, and the decode-error policy."""

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    key: ColumnFormat = ColumnFormat()
    value: ColumnFormat = ColumnFormat()
    registry: RegistryConfig | None = None
    on_decode_error: DecodeErrorPolicy = DecodeErrorPolicy.FAIL

    @model_validator(mode="after")
    def _check(self) -> FormatConfig:
        for name, column in (("value_format", self.value), ("key_format", self.key)):
            if column.format.registered and self.registry is None:
                raise ValueError(f"{name}: {column.format.value!r} needs schema_registry_url (the registry's URL)")
        if self.registry is not None and self.registry.subject_name_strategy is not SubjectNameStrategy.TOPIC:
            for name, column in (("value_record_name", self.value), ("key_record_name", self.key)):
                if column.format.registered and column.record_name is None:
                    raise ValueError(
                        f"{name}: {self.registry.subject_name_strategy.value} names subjects after the record; "
                        "give the record's fully qualified name"
                    )
        return self

    @property
    def typed(self) -> bool:
        """Whether anything is decoded (else the sources return Spark's Kafka schema, as before)."""
        return self.key.format is not RecordFormat.BYTES or self.value.format is not RecordFormat.BYTES

    def to_options(self) -> dict[str, str]:
        """The configuration as Spark source options: the format and registry without the secrets, which travel
        as files or under the names of ``SECRET_OPTION_NAMES`` (Spark's redaction covers them)."""
        dumped = self.model_dump(mode="json", exclude={"registry": {"basic_auth_user_info", "bearer_token"}})
        options = {"formats": json.dumps(dumped, sort_keys=True)}
        if self.registry is not None:
            if self.registry.basic_auth_user_info is not None:
                options[SECRET_OPTION_NAMES[0]] = self.registry.basic_auth_user_info.get_secret_value()
            if self.registry.bearer_token is not None:
                options[SECRET_OPTION_NAMES[1]] = self.registry.bearer_token.get_secret_value()
        return options

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> FormatConfig:
        """The configuration ``to_options`` wrote (Spark lower-cases option names: both spellings are read)."""
        lowered = {key.lower(): value for key, value in options.items()}
        raw = lowered.get("formats")
        if raw is None:
            return cls()
        data = json.loads(raw)
        registry = data.get("registry")
        if isinstance(registry, dict):
            user_info = lowered.get(SECRET_OPTION_NAMES[0])
            token = lowered.get(SECRET_OPTION_NAMES[1])
            if user_info is not None:
                registry["basic_auth_user_info"] = user_info
            if token is not None:
                registry["bearer_token"] = token
        return cls.model_validate(data)


def subject_for(strategy: SubjectNameStrategy, topic: str, record_name: str | None, *, is_key: bool) -> str:
    """The subject a record's schema is registered under (Confluent's strategies)."""
    if strategy is SubjectNameStrategy.TOPIC:
        return f"{topic}-{'key' if is_key else 'value'}"
    if record_name is None:
        raise ValueError(f"{strategy.value} needs the record's fully qualified name")
    if strategy is SubjectNameStrategy.RECORD:
        return record_name
    return f"{topic}-{record_name}"
