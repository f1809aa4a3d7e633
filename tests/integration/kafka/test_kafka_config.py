"""KafkaStreamConfig: errors name the field, secrets never show, properties pass through untouched."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from pydantic import ValidationError

from dagster_streamgroup.dagster import KafkaStreamGroup, StreamGroupConfigError
from dagster_streamgroup.spark.kafka_source import spark_options
from dagster_streamgroup.streams.kafka_config import SECRET_PROPERTIES, KafkaStreamConfig

SECRET = "s3rv3rl3ss-Pa55"
SPARK_REDACTION = re.compile(r"(?i)secret|password|token|access[.]?key")
"""Spark's default ``spark.redaction.regex``: options whose key it matches are shown redacted in query plans."""


def _config(**kw: Any) -> KafkaStreamConfig:
    return KafkaStreamConfig(**{"bootstrap_servers": "127.0.0.1:9092", "topics": ["orders"], **kw})


def _error(**kw: Any) -> str:
    with pytest.raises(ValidationError) as caught:
        _config(**kw)
    text = str(caught.value)
    assert SECRET not in text
    return text


def test_properties_pass_through_untouched() -> None:
    props = {"fetch.max.bytes": 1234, "client.id": "me", "enable.ssl.certificate.verification": False}
    config = _config(properties=props).client_config()
    assert config == {"bootstrap.servers": "127.0.0.1:9092", **props}


@pytest.mark.parametrize(
    ("kw", "field", "reason"),
    [
        ({"bootstrap_servers": ""}, "bootstrap_servers", "host:port"),
        ({"bootstrap_servers": "kafka:99999"}, "bootstrap_servers", "1..65535"),
        ({"topics": []}, "topics", "at least 1"),
        ({"topics": ["a b"]}, "topics", "not a valid Kafka topic name"),
        ({"topics": ["a", "a"]}, "topics", "listed twice"),
        ({"properties": {"sasl.password": SECRET}}, "properties", "typed field"),
        ({"properties": {"security.protocol": "SSL"}}, "properties", "set security_protocol instead"),
        ({"properties": {"group.id": "g"}}, "properties", "chosen per call"),
        ({"sasl_mechanism": "PLAIN", "sasl_username": "u", "sasl_password": SECRET}, "security_protocol", "SASL_SSL"),
        ({"security_protocol": "SASL_SSL"}, "sasl_mechanism", "required"),
        (
            {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "sasl_password": SECRET},
            "sasl_username",
            "required",
        ),
        (
            {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-256", "sasl_username": "u"},
            "sasl_password",
            "required",
        ),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "GSSAPI"}, "sasl_mechanism", "PLAIN"),
        ({"sasl_password": SECRET, "sasl_password_file": "/x"}, "sasl_password", "not both"),
        ({"ssl_ca_location": "/ca.pem"}, "security_protocol", "SSL or SASL_SSL"),
        (
            {
                "security_protocol": "SASL_SSL",
                "sasl_mechanism": "PLAIN",
                "sasl_username": "u",
                "sasl_password": SECRET,
                "oauthbearer_client_id": "c",
            },
            "sasl_mechanism",
            "OAUTHBEARER",
        ),
        (
            {
                "security_protocol": "SASL_SSL",
                "sasl_mechanism": "OAUTHBEARER",
                "oauthbearer_client_id": "c",
                "oauthbearer_token_endpoint_url": "https://idp/token",
            },
            "oauthbearer_client_secret",
            "required",
        ),
        ({"unknown_field": 1}, "unknown_field", "Extra inputs"),
    ],
)
def test_bad_input_names_the_field_and_reason(kw: dict[str, Any], field: str, reason: str) -> None:
    text = _error(**kw)
    assert field in text
    assert reason in text


def test_secrets_are_not_in_repr_or_dump() -> None:
    config = _config(
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="svc",
        sasl_password=SECRET,
        ssl_key_password=SECRET,
    )
    assert SECRET not in repr(config)
    assert SECRET not in str(config.model_dump())
    assert SECRET not in config.model_dump_json()
    client = config.client_config()
    assert client["sasl.password"] == SECRET
    assert client["ssl.key.password"] == SECRET
    assert client["sasl.mechanism"] == "SCRAM-SHA-512"
    assert client["security.protocol"] == "SASL_SSL"
    assert client["sasl.username"] == "svc"


def test_secrets_come_from_mounted_files_relative_to_secret_path(tmp_path: Path) -> None:
    (tmp_path / "password").write_text(SECRET + "\n")
    (tmp_path / "client-secret").write_text("oidc-" + SECRET)
    config = _config(
        security_protocol="SASL_SSL",
        sasl_mechanism="OAUTHBEARER",
        oauthbearer_client_id="svc",
        oauthbearer_client_secret_file="client-secret",
        oauthbearer_token_endpoint_url="https://idp.example/token",
        ssl_ca_location="ca.pem",
        ssl_certificate_location="/abs/cert.pem",
        secret_path=tmp_path,
    )
    client = config.client_config()
    assert client["sasl.oauthbearer.method"] == "oidc"
    assert client["sasl.oauthbearer.client.secret"] == "oidc-" + SECRET
    assert client["ssl.ca.location"] == str(tmp_path / "ca.pem")
    assert client["ssl.certificate.location"] == "/abs/cert.pem"
    plain = _config(
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_username="u",
        sasl_password_file=tmp_path / "password",
    )
    assert plain.client_config()["sasl.password"] == SECRET  # trailing newline of the mounted file stripped


def test_an_unreadable_secret_file_is_a_clear_error(tmp_path: Path) -> None:
    config = _config(
        security_protocol="SASL_SSL",
        sasl_mechanism="PLAIN",
        sasl_username="u",
        sasl_password_file="missing",
        secret_path=tmp_path,
    )
    with pytest.raises(ValueError, match=r"sasl_password_file: cannot read .*missing"):
        config.client_config()


# Every librdkafka property that can hold a secret (librdkafka's CONFIGURATION.md, 2.16.0), the Java client's that
# users copy from Spark's Kafka source, and names caught by the ``.password`` / ``.secret`` suffix rule.
LIBRDKAFKA_SECRETS = [
    "sasl.password",
    "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.client.credentials.client.secret",
    "sasl.oauthbearer.config",
    "sasl.oauthbearer.assertion.private.key.pem",
    "sasl.oauthbearer.assertion.private.key.passphrase",
    "ssl.key.password",
    "ssl.key.pem",
    "ssl_key",
    "ssl.keystore.password",
]
JAVA_SECRETS = ["sasl.jaas.config", "ssl.keystore.key", "ssl.truststore.password"]
SPELLINGS = ["kafka.sasl.jaas.config", "kafka.sasl.oauthbearer.config", "SASL.OAUTHBEARER.CONFIG", " ssl.key.pem"]
SUFFIXED = ["some.future.password", "sasl.oauthbearer.future.secret"]


def _snapshot_of(group: KafkaStreamGroup) -> str:
    """The code location's snapshot: the resource's configured values as the Dagster UI shows them (and runs keep)."""
    from dagster._core.remote_representation.external_data import RepositorySnap
    from dagster._serdes import serialize_value

    @dg.asset(required_resource_keys={"kafka"})
    def uses_it() -> None:
        """Only here to make the resource part of the definitions."""

    repository = dg.Definitions(assets=[uses_it], resources={"kafka": group}).get_repository_def()
    return serialize_value(RepositorySnap.from_def(repository))


def _everything_shown(properties: dict[str, str]) -> tuple[list[str], list[str]]:
    """What ``properties`` reach, and which places refused them. The connection config's repr and JSON dump; the
    Spark options as Spark shows them (redacting keys its default redaction regex matches); the Dagster resource's
    configured values in the code location's snapshot (the UI). A place that refuses the configuration shows its
    error instead."""
    shown: list[str] = []
    refused: list[str] = []
    try:
        config = _config(properties=properties)
    except ValidationError as exc:
        shown.append(str(exc))
        refused.append("KafkaStreamConfig")
    else:
        shown += [repr(config), config.model_dump_json()]
        shown += [
            f"{key}={'*********(redacted)' if SPARK_REDACTION.search(key) else value}"
            for key, value in spark_options(config).items()
        ]
    try:
        group = KafkaStreamGroup(
            group="g", bootstrap_servers="127.0.0.1:9092", topics=["orders"], properties=properties
        )
    except (ValidationError, StreamGroupConfigError, dg.DagsterInvalidConfigError) as exc:
        shown.append(str(exc))
        refused.append("KafkaStreamGroup")
    else:
        shown += [repr(group), _snapshot_of(group)]
    return shown, refused


@pytest.mark.parametrize("prop", LIBRDKAFKA_SECRETS + JAVA_SECRETS + SPELLINGS + SUFFIXED)
def test_a_secret_property_is_never_shown(prop: str) -> None:
    shown, refused = _everything_shown({prop: SECRET, "client.id": "me"})
    assert [text for text in shown if SECRET in text] == []
    # It is refused by name (the place to give it is a typed SecretStr/file field), so it never reaches a client.
    assert refused == ["KafkaStreamConfig", "KafkaStreamGroup"]
    text = _error(properties={prop: SECRET})
    assert repr(prop) in text and "holds a secret" in text


def test_the_secret_list_is_the_documented_one() -> None:
    assert {name for name in LIBRDKAFKA_SECRETS + JAVA_SECRETS} == SECRET_PROPERTIES


def test_a_secret_property_with_a_typed_field_names_it() -> None:
    assert "sasl_password or sasl_password_file" in _error(properties={"sasl.password": SECRET})
    text = _error(properties={"sasl.oauthbearer.client.credentials.client.secret": SECRET})
    assert "oauthbearer_client_secret or oauthbearer_client_secret_file" in text
    assert "ssl_key_location" in _error(properties={"ssl.key.pem": SECRET})
    assert "has no typed field" in _error(properties={"sasl.oauthbearer.assertion.private.key.passphrase": SECRET})


@pytest.mark.parametrize(
    "prop",
    [
        "ssl.keystore.location",
        "ssl.certificate.pem",
        "ssl.ca.pem",
        "https.ca.pem",
        "sasl.kerberos.keytab",
        "sasl.oauthbearer.assertion.private.key.file",
        "sasl.oauthbearer.assertion.file",
        "sasl.oauthbearer.assertion.claim.sub",
    ],
)
def test_paths_certificates_and_names_near_the_secrets_still_pass_through(prop: str) -> None:
    assert _config(properties={prop: "/etc/kafka/x.pem"}).client_config()[prop] == "/etc/kafka/x.pem"
