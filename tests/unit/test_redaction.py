"""The string redaction every session and server we start sets: each secret option's value disappears from the
texts a Spark Connect server shows (its plan text in the UI, the job descriptions, the event log), in every
form they take, and other options stay readable. The Connect server itself: tests/secrets/test_secrets.py."""

from __future__ import annotations

import re

import pytest

from dagster_streamgroup.spark.redaction import (
    SECRET_REDACTION_REGEX,
    STRING_REDACTION_KEY,
    V3IO_ACCESS_KEY_OPTION,
    with_string_redaction,
)
from dagster_streamgroup.streams.kafka_config import SECRET_PROPERTIES

SECRET = "s3cr3t-VALUE_4711"
PEM = "-----BEGIN PRIVATE KEY-----\\nMIIEv" + SECRET + "\\n-----END PRIVATE KEY-----"
JAAS = (
    'org.apache.kafka.common.security.plain.PlainLoginModule required username=\\"u\\" password=\\"' + SECRET + '\\";'
)
OPTIONS = sorted({f"kafka.{name}" for name in SECRET_PROPERTIES} | {V3IO_ACCESS_KEY_OPTION, "kafka.new.thing.secret"})


def forms(option: str, value: str) -> list[str]:
    """How a Connect server's texts hold an option: its plan's text format, a Scala map, JSON, key=value."""
    return [
        f'options {{\n  key: "kafka.bootstrap.servers"\n  value: "127.0.0.1:9092"\n}}\noptions {{\n'
        f'  key: "{option}"\n  value: "{value}"\n}}',
        f"Map(kafka.bootstrap.servers -> 127.0.0.1:9092, {option} -> {value}, ranges -> [])",
        f'{{"kafka.bootstrap.servers": "127.0.0.1:9092", "{option}": "{value}"}}',
        f"{option}={value}",
    ]


@pytest.mark.parametrize("option", OPTIONS)
@pytest.mark.parametrize("value", [SECRET, PEM, JAAS], ids=["plain", "pem", "jaas"])
def test_every_secret_option_is_redacted_in_every_form(option: str, value: str) -> None:
    for text in forms(option, value):
        redacted = re.sub(SECRET_REDACTION_REGEX, "*********(redacted)", text)
        assert SECRET not in redacted, redacted
        assert "redacted" in redacted
        if "kafka.bootstrap.servers" in text:
            assert "127.0.0.1:9092" in redacted, "other options stay readable"


def test_a_users_own_setting_wins() -> None:
    assert with_string_redaction({})[STRING_REDACTION_KEY] == SECRET_REDACTION_REGEX
    assert with_string_redaction({STRING_REDACTION_KEY: "mine"})[STRING_REDACTION_KEY] == "mine"
