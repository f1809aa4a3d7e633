"""KafkaStreamConfig: errors name the field, secrets never show, properties pass through untouched."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from dagster_streamgroup.streams.kafka_config import KafkaStreamConfig

SECRET = "s3rv3rl3ss-Pa55"


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
