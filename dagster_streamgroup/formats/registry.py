"""The Schema Registry seen from a run: confluent-kafka's own ``SchemaRegistryClient``, a schema cache per id, and
errors that say which registry failed and how, never with a credential.

A schema id names one schema for good (registries never reuse an id for another schema), so a schema fetched once
is kept for the life of the process, keyed by the registry's URL and the id: a run's tasks (Spark reuses its Python
workers), its carried-on waves and the later runs of a reused worker ask the registry once per id. The driver
also hands the schemas it holds to the tasks in the source's options (``SchemaCache.export``), so a task asks the
registry only for an id nobody in the run has seen yet, and an outage of the registry while every schema is held
costs nothing.

Failures are told apart: a schema id the registry does not know (``UnknownSchemaError``: the record is a bad
record, the decode-error policy applies), a refused login (``RegistryAuthError``), and the registry down, slow or
failing (``RegistryUnavailableError``: the range is retried with its bounds, without counting an attempt).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from dagster_streamgroup.formats.config import RegistryConfig

if TYPE_CHECKING:
    from confluent_kafka.schema_registry import SchemaRegistryClient

T = TypeVar("T")

REGISTRY_UNAVAILABLE_MARK = "streamgroup-registry-unavailable"
"""Begins the message of ``RegistryUnavailableError``: a run finds it in the text of a failed Spark job, whose
exception class does not survive the trip from a task."""


class RegistryError(RuntimeError):
    """A request to the Schema Registry failed; the message names the registry and what was asked."""


class RegistryUnavailableError(RegistryError):
    """The registry did not answer, answered too late, or failed (HTTP 5xx): nothing says the request was wrong."""


class RegistryAuthError(RegistryError):
    """The registry refused the credentials (HTTP 401/403)."""


class UnknownSchemaError(RegistryError):
    """The registry does not know the schema id, subject or version asked for (HTTP 404)."""


@dataclass(frozen=True)
class RegisteredText:
    """A schema as the registry holds it."""

    schema_id: int
    schema_type: str
    """``AVRO``, ``PROTOBUF`` or ``JSON``."""
    text: str
    """The schema (Avro and JSON Schema: JSON; Protobuf: its ``.proto`` text, or the base64 of a serialized
    ``FileDescriptorProto`` when asked in the ``serialized`` format)."""
    references: tuple[tuple[str, str, int], ...] = ()
    """(name, subject, version) of each schema this one imports."""
    subject: str | None = None
    version: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.schema_id,
            "type": self.schema_type,
            "text": self.text,
            "references": [list(r) for r in self.references],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RegisteredText:
        return cls(
            schema_id=int(data["id"]),
            schema_type=str(data["type"]),
            text=str(data["text"]),
            references=tuple((str(n), str(s), int(v)) for n, s, v in data.get("references", [])),
        )


_lock = threading.Lock()
_clients: dict[str, tuple[str, SchemaRegistryClient]] = {}
_schemas: dict[tuple[str, int, str], RegisteredText] = {}
"""(registry URL, schema id, format) -> schema: ids never change what they name."""


def clear_caches() -> None:
    """Forget every client and schema of this process (tests that restart a registry on the same port)."""
    with _lock:
        _clients.clear()
        _schemas.clear()


def _client(config: RegistryConfig) -> SchemaRegistryClient:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    fingerprint = config.credentials_fingerprint()
    with _lock:
        entry = _clients.get(config.identity())
        if entry is not None and entry[0] == fingerprint:
            return entry[1]
    try:
        client = SchemaRegistryClient(config.client_config())
    except (ValueError, TypeError) as exc:
        # The client's own checks (a URL, a certificate pair); its texts hold no secrets.
        raise RegistryError(f"schema_registry_url: the registry client refused the configuration: {exc}") from None
    with _lock:
        _clients[config.identity()] = (fingerprint, client)
    return client


class SchemaSource:
    """Schemas of one registry, through its cache."""

    def __init__(self, config: RegistryConfig) -> None:
        self.config = config

    def _call(self, what: str, call: Callable[[SchemaRegistryClient], T]) -> T:
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        where = f"schema registry {self.config.shown_url}"
        try:
            return call(_client(self.config))
        except SchemaRegistryError as exc:
            status, code = exc.http_status_code, exc.error_code
            detail = f"{what}: {where} answered HTTP {status} (error code {code})"
            if status == 404:
                raise UnknownSchemaError(detail) from None
            if status in (401, 403):
                raise RegistryAuthError(
                    f"{detail}: it refused the credentials; check schema_registry_basic_auth_user_info "
                    "(or its _file) or schema_registry_bearer_token (or its _file)"
                ) from None
            if status >= 500 or status in (408, 429):
                raise RegistryUnavailableError(f"{REGISTRY_UNAVAILABLE_MARK}: {detail}") from None
            raise RegistryError(f"{detail}: {str(exc.error_message)[:300]}") from None
        except RegistryError:
            raise
        except Exception as exc:  # httpx2's transport errors (refused, reset, timed out), ssl errors
            kind = type(exc).__name__
            raise RegistryUnavailableError(
                f"{REGISTRY_UNAVAILABLE_MARK}: {what}: {where} did not answer within "
                f"{self.config.timeout_s:g} s ({kind}); the range is retried with its bounds, no attempt counted"
            ) from None

    def by_id(self, schema_id: int, *, serialized: bool = False) -> RegisteredText:
        """The schema of ``schema_id`` (Protobuf: ``serialized`` asks for a ``FileDescriptorProto``)."""
        fmt = "serialized" if serialized else ""
        key = (self.config.identity(), schema_id, fmt)
        with _lock:
            held = _schemas.get(key)
        if held is not None:
            return held

        def fetch(client: SchemaRegistryClient) -> RegisteredText:
            schema = client.get_schema(schema_id, fmt=fmt or None)
            return _registered(schema_id, schema)

        found = self._call(f"schema id {schema_id}", fetch)
        with _lock:
            _schemas[key] = found
        return found

    def version(
        self, subject: str, version: int | Literal["latest"] = "latest", *, serialized: bool = False
    ) -> RegisteredText:
        """A subject's version (``latest``: asked of the registry every time: it moves)."""

        def fetch(client: SchemaRegistryClient) -> RegisteredText:
            registered = client.get_version(subject, version, True, "serialized" if serialized else None)
            found = _registered(int(registered.schema_id or 0), registered.schema)
            return RegisteredText(
                found.schema_id,
                found.schema_type,
                found.text,
                found.references,
                subject=subject,
                version=int(registered.version or 0),
            )

        found = self._call(f"subject {subject!r} version {version}", fetch)
        if version != "latest":
            with _lock:
                _schemas.setdefault(
                    (self.config.identity(), found.schema_id, "serialized" if serialized else ""), found
                )
        return found

    def register(self, subject: str, text: str, schema_type: str = "AVRO") -> int:
        """Register a schema (tests, the example's producer, the benchmark): its id."""
        from confluent_kafka.schema_registry import Schema

        return int(
            self._call(
                f"registering under {subject!r}", lambda c: c.register_schema(subject, Schema(text, schema_type))
            )
        )

    def client(self) -> SchemaRegistryClient:
        """confluent-kafka's client itself, for its serializers (producers, tests)."""
        return _client(self.config)

    def export(self, schema_ids: Iterable[int] | None = None) -> dict[str, dict[str, Any]]:
        """The schemas this process holds of this registry (all, or ``schema_ids``), for a task's options."""
        wanted = None if schema_ids is None else set(schema_ids)
        identity = self.config.identity()
        with _lock:
            return {
                f"{schema_id}:{fmt}": text.to_json()
                for (url, schema_id, fmt), text in _schemas.items()
                if url == identity and (wanted is None or schema_id in wanted)
            }

    def seed(self, exported: Mapping[str, Mapping[str, Any]]) -> None:
        """Take in schemas another process exported (a task receives the driver's)."""
        identity = self.config.identity()
        with _lock:
            for key, data in exported.items():
                schema_id, _, fmt = key.partition(":")
                _schemas.setdefault((identity, int(schema_id), fmt), RegisteredText.from_json(data))


def _registered(schema_id: int, schema: Any) -> RegisteredText:
    refs = tuple((str(r.name), str(r.subject), int(r.version)) for r in (schema.references or []))
    return RegisteredText(schema_id, str(schema.schema_type or "AVRO"), str(schema.schema_str), refs)
