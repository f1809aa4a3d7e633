"""How to reach a Kafka topic set: bootstrap servers, topics, librdkafka properties, and security settings.

The typed security fields mirror what Nuclio's Kafka trigger accepts (SASL user/password/mechanism, TLS
CA/cert/key, OAuth client secret) and map one to one onto librdkafka properties. Secrets are ``SecretStr``
or paths of mounted secret files (Nuclio's ``secretPath`` convention: a directory plus file names relative
to it), read only when the client configuration is built, so rotated files are picked up and a secret never
sits in a repr, a log line or an error message.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

PropertyValue = str | int | float | bool

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"]

_TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")

SECRET_PROPERTIES = frozenset(
    {
        # Every property of librdkafka's CONFIGURATION.md that can hold a secret (checked against the table of
        # librdkafka 2.16.0, the one confluent-kafka 2.16 bundles):
        "sasl.password",
        "sasl.oauthbearer.client.secret",
        "sasl.oauthbearer.client.credentials.client.secret",  # alias of sasl.oauthbearer.client.secret
        "sasl.oauthbearer.config",  # free-form: OAUTHBEARER token implementations take credentials from it
        "sasl.oauthbearer.assertion.private.key.pem",
        "sasl.oauthbearer.assertion.private.key.passphrase",
        "ssl.key.password",
        "ssl.key.pem",
        "ssl_key",  # the in-memory private key (rd_kafka_conf_set_ssl_cert)
        "ssl.keystore.password",
        # The Java client's (and so Spark's Kafka source's, as kafka.<name>) secrets, which users copy over:
        "sasl.jaas.config",
        "ssl.keystore.key",
        "ssl.truststore.password",
    }
)
"""Properties that hold secrets. ``properties`` are shown as given (in reprs, in the resource configuration the
Dagster UI shows, as Spark options), so these are refused there and must come through the typed SecretStr/file
fields. Not secrets, so allowed: paths (``ssl.key.location``, ``ssl.keystore.location``,
``sasl.oauthbearer.assertion.private.key.file``, ``sasl.oauthbearer.assertion.file``, ``sasl.kerberos.keytab``),
certificates (``ssl.certificate.pem``, ``ssl.ca.pem``, ``https.ca.pem``) and names (``sasl.username``,
``sasl.oauthbearer.client.id``, ``sasl.kerberos.principal``)."""

SECRET_SUFFIXES = (".password", ".secret")
"""Any property named like these is a secret too (e.g. a property a newer librdkafka adds)."""

_OIDC_SECRET_FIELD = "oauthbearer_client_secret or oauthbearer_client_secret_file"
_KEY_FILE_FIELD = "ssl_key_location (the key in a mounted file)"
_SECRET_FIELDS = {
    "sasl.password": "sasl_password or sasl_password_file",
    "sasl.oauthbearer.client.secret": _OIDC_SECRET_FIELD,
    "sasl.oauthbearer.client.credentials.client.secret": _OIDC_SECRET_FIELD,
    "ssl.key.password": "ssl_key_password or ssl_key_password_file",
    "ssl.key.pem": _KEY_FILE_FIELD,
    "ssl_key": _KEY_FILE_FIELD,
}
"""The typed fields that carry a secret property, for the error message."""


def is_secret_property(key: str) -> bool:
    """Whether a property name holds a secret; also under Spark's ``kafka.`` prefix and in any case."""
    name = key.strip().lower().removeprefix("kafka.")
    return name in SECRET_PROPERTIES or name.endswith(SECRET_SUFFIXES)


def _secret_property_error(key: str) -> str:
    name = key.strip().lower().removeprefix("kafka.")
    field = _SECRET_FIELDS.get(name)
    shown = "properties are shown as given (reprs, the Dagster UI, Spark options)"
    if field is not None:
        return f"{key!r} holds a secret: set the typed field {field} instead; {shown}"
    return f"{key!r} holds a secret and has no typed field, so it cannot be set here: {shown}"


_TYPED_PROPERTIES = {
    "bootstrap.servers": "bootstrap_servers",
    "security.protocol": "security_protocol",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.mechanisms": "sasl_mechanism",
    "sasl.username": "sasl_username",
    "ssl.ca.location": "ssl_ca_location",
    "ssl.certificate.location": "ssl_certificate_location",
    "ssl.key.location": "ssl_key_location",
    "sasl.oauthbearer.method": "oauthbearer_client_id",
    "sasl.oauthbearer.client.id": "oauthbearer_client_id",
    "sasl.oauthbearer.token.endpoint.url": "oauthbearer_token_endpoint_url",
    "sasl.oauthbearer.scope": "oauthbearer_scope",
}


class KafkaStreamConfig(BaseModel):
    """A Kafka topic set and how to connect to its cluster."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    bootstrap_servers: str = Field(description="Comma-separated host:port list (librdkafka bootstrap.servers).")
    topics: list[str] = Field(min_length=1, description="The topics whose partitions form the stream's shards.")
    properties: dict[str, PropertyValue] = Field(
        default_factory=dict,
        description="Any other librdkafka properties, passed to every client untouched (no secrets here).",
    )
    security_protocol: SecurityProtocol | None = Field(default=None, description="librdkafka security.protocol.")
    sasl_mechanism: SaslMechanism | None = Field(default=None, description="librdkafka sasl.mechanism.")
    sasl_username: str | None = Field(default=None, description="librdkafka sasl.username.")
    sasl_password: SecretStr | None = Field(default=None, description="librdkafka sasl.password.")
    sasl_password_file: Path | None = Field(
        default=None, description="A mounted file holding the SASL password (relative to secret_path if set)."
    )
    oauthbearer_client_id: str | None = Field(default=None, description="OIDC client id (OAUTHBEARER).")
    oauthbearer_client_secret: SecretStr | None = Field(default=None, description="OIDC client secret.")
    oauthbearer_client_secret_file: Path | None = Field(
        default=None, description="A mounted file holding the OIDC client secret (relative to secret_path if set)."
    )
    oauthbearer_token_endpoint_url: str | None = Field(default=None, description="OIDC token endpoint URL.")
    oauthbearer_scope: str | None = Field(default=None, description="OIDC scope.")
    ssl_ca_location: Path | None = Field(
        default=None, description="CA certificate file (relative to secret_path if set)."
    )
    ssl_certificate_location: Path | None = Field(
        default=None, description="Client certificate file (relative to secret_path if set)."
    )
    ssl_key_location: Path | None = Field(
        default=None, description="Client private key file (relative to secret_path if set)."
    )
    ssl_key_password: SecretStr | None = Field(default=None, description="Password of the client private key.")
    ssl_key_password_file: Path | None = Field(
        default=None, description="A mounted file holding the private key's password (relative to secret_path)."
    )
    secret_path: Path | None = Field(
        default=None,
        description="Directory where secrets are mounted; relative *_file/*_location paths are resolved in it.",
    )
    adopt_group_offsets: bool = Field(
        default=False,
        description="Take over a Kafka consumer group of the same name that another application owns (it has a "
        "protocol type, its consumers are stopped): start from its offsets and advance them. That application "
        "then skips what we processed when it restarts, so this is off by default and the group is refused.",
    )

    @field_validator("bootstrap_servers")
    @classmethod
    def _check_bootstrap(cls, value: str) -> str:
        servers = [s.strip() for s in value.split(",")]
        if not value.strip() or any(not s for s in servers):
            raise ValueError("must be a comma-separated list of host:port, e.g. '127.0.0.1:9092'")
        for server in servers:
            host, sep, port = server.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"{server!r} is not host:port with a port in 1..65535")
        return ",".join(servers)

    @field_validator("topics")
    @classmethod
    def _check_topics(cls, value: list[str]) -> list[str]:
        for topic in value:
            if not _TOPIC_RE.match(topic) or topic in {".", ".."}:
                raise ValueError(f"{topic!r} is not a valid Kafka topic name (1-249 of [A-Za-z0-9._-])")
        duplicates = sorted({t for t in value if value.count(t) > 1})
        if duplicates:
            raise ValueError(f"topics listed twice: {duplicates}")
        return value

    @field_validator("properties")
    @classmethod
    def _check_properties(cls, value: dict[str, PropertyValue]) -> dict[str, PropertyValue]:
        for key in value:
            if is_secret_property(key):
                raise ValueError(_secret_property_error(key))
            if key in _TYPED_PROPERTIES:
                raise ValueError(f"{key!r} has a typed field: set {_TYPED_PROPERTIES[key]} instead")
            if key == "group.id":
                raise ValueError("'group.id' is chosen per call (the consumer group is an argument), not here")
        return value

    @model_validator(mode="after")
    def _check_security(self) -> Self:
        def exclusive(a: str, b: str) -> None:
            if getattr(self, a) is not None and getattr(self, b) is not None:
                raise ValueError(f"{a}: set either {a} or {b}, not both")

        exclusive("sasl_password", "sasl_password_file")
        exclusive("oauthbearer_client_secret", "oauthbearer_client_secret_file")
        exclusive("ssl_key_password", "ssl_key_password_file")
        sasl_protocol = self.security_protocol in {"SASL_PLAINTEXT", "SASL_SSL"}
        if self.sasl_mechanism is not None and not sasl_protocol:
            raise ValueError(
                f"security_protocol: must be SASL_SSL or SASL_PLAINTEXT when sasl_mechanism is set "
                f"(got {self.security_protocol})"
            )
        if sasl_protocol and self.sasl_mechanism is None:
            raise ValueError("sasl_mechanism: required when security_protocol is SASL_SSL or SASL_PLAINTEXT")
        has_password = self.sasl_password is not None or self.sasl_password_file is not None
        if self.sasl_mechanism in {"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"}:
            if not self.sasl_username:
                raise ValueError(f"sasl_username: required for sasl_mechanism {self.sasl_mechanism}")
            if not has_password:
                raise ValueError(
                    f"sasl_password: required for sasl_mechanism {self.sasl_mechanism} (or sasl_password_file)"
                )
        oidc = (self.oauthbearer_client_id, self.oauthbearer_token_endpoint_url)
        if any(v is not None for v in oidc) or self.oauthbearer_client_secret or self.oauthbearer_client_secret_file:
            if self.sasl_mechanism != "OAUTHBEARER":
                raise ValueError("sasl_mechanism: must be OAUTHBEARER when oauthbearer_* fields are set")
            if None in oidc:
                raise ValueError(
                    "oauthbearer_token_endpoint_url: OIDC needs oauthbearer_client_id and "
                    "oauthbearer_token_endpoint_url (and a client secret)"
                )
            if self.oauthbearer_client_secret is None and self.oauthbearer_client_secret_file is None:
                raise ValueError("oauthbearer_client_secret: required for OIDC (or oauthbearer_client_secret_file)")
        ssl_fields = (self.ssl_ca_location, self.ssl_certificate_location, self.ssl_key_location)
        if any(v is not None for v in ssl_fields) and self.security_protocol not in {"SSL", "SASL_SSL"}:
            raise ValueError(
                "security_protocol: must be SSL or SASL_SSL when ssl_* locations are set "
                f"(got {self.security_protocol})"
            )
        return self

    def resolve_path(self, path: Path) -> Path:
        """A secret/certificate path as used: relative paths are taken inside ``secret_path``."""
        if self.secret_path is not None and not path.is_absolute():
            return self.secret_path / path
        return path

    def _read_secret(self, field: str, path: Path) -> str:
        resolved = self.resolve_path(path)
        try:
            value = resolved.read_text().strip()
        except OSError as exc:
            raise ValueError(f"{field}: cannot read {resolved}: {exc.strerror}") from None
        if not value:
            raise ValueError(f"{field}: {resolved} is empty")
        return value

    def _secret(self, field: str) -> str | None:
        direct = getattr(self, field)
        if direct is not None:
            return str(direct.get_secret_value())
        path = getattr(self, f"{field}_file")
        return None if path is None else self._read_secret(f"{field}_file", path)

    def client_config(self) -> dict[str, PropertyValue]:
        """The librdkafka configuration dict for any client (add ``group.id`` for consumers).

        It holds secrets in clear text: hand it to confluent-kafka and never log it."""
        config: dict[str, PropertyValue] = {"bootstrap.servers": self.bootstrap_servers}
        if self.security_protocol is not None:
            config["security.protocol"] = self.security_protocol
        if self.sasl_mechanism is not None:
            config["sasl.mechanism"] = self.sasl_mechanism
        if self.sasl_username is not None:
            config["sasl.username"] = self.sasl_username
        password = self._secret("sasl_password")
        if password is not None:
            config["sasl.password"] = password
        if self.oauthbearer_client_id is not None:
            config["sasl.oauthbearer.method"] = "oidc"
            config["sasl.oauthbearer.client.id"] = self.oauthbearer_client_id
            config["sasl.oauthbearer.token.endpoint.url"] = str(self.oauthbearer_token_endpoint_url)
            client_secret = self._secret("oauthbearer_client_secret")
            if client_secret is not None:
                config["sasl.oauthbearer.client.secret"] = client_secret
            if self.oauthbearer_scope is not None:
                config["sasl.oauthbearer.scope"] = self.oauthbearer_scope
        for field, prop in (
            ("ssl_ca_location", "ssl.ca.location"),
            ("ssl_certificate_location", "ssl.certificate.location"),
            ("ssl_key_location", "ssl.key.location"),
        ):
            path = getattr(self, field)
            if path is not None:
                config[prop] = str(self.resolve_path(path))
        key_password = self._secret("ssl_key_password")
        if key_password is not None:
            config["ssl.key.password"] = key_password
        config.update(self.properties)
        return config
