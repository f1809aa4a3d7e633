"""The typed-records configuration of the group resources: every bad field is named, the registry's credentials
never appear in an error, a repr or a source option Spark shows, and the decoding options survive the trip to a
task."""

from __future__ import annotations

import re

import pytest

from dagster_streamgroup.dagster import KafkaStreamGroup, V3ioStreamGroup
from dagster_streamgroup.dagster.resources import StreamGroupConfigError
from dagster_streamgroup.formats.config import SECRET_OPTION_NAMES, FormatConfig
from dagster_streamgroup.spark.redaction import SECRET_REDACTION_REGEX

SECRET = "s3cr3t-registry-password"
SPARK_DEFAULT_REDACTION = r"(?i)secret|password|token|access[.]?key"
"""Spark's default ``spark.redaction.regex``: option names it matches are redacted in the plans Spark renders."""


def kafka(**fields: object) -> KafkaStreamGroup:
    return KafkaStreamGroup(group="g", bootstrap_servers="127.0.0.1:9092", topics=["t"], **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"value_format": "avro"}, "value_format: 'avro' needs schema_registry_url"),
        ({"value_format": "xml"}, "value_format:"),
        ({"key_format": "protobuf"}, "key_format: 'protobuf' needs schema_registry_url"),
        ({"value_format": "json"}, "value_json_schema: format 'json' needs"),
        ({"value_format": "json", "value_json_schema": "[1]"}, "value_json_schema: must be a JSON object"),
        ({"value_json_schema": "{}"}, "value_json_schema: only for format 'json'"),
        ({"on_decode_error": "skip"}, "on_decode_error:"),
        ({"value_format": "avro", "schema_registry_url": "ftp://r"}, "schema_registry_url:"),
        ({"value_format": "avro", "schema_registry_url": "http://r", "subject_name_strategy": "Mine"},
         "subject_name_strategy:"),
        ({"value_format": "avro", "schema_registry_url": "http://r", "subject_name_strategy": "RecordNameStrategy"},
         "value_record_name: RecordNameStrategy names subjects after the record"),
        ({"schema_registry_bearer_token_file": "/x"}, "schema_registry_bearer_token_file: set schema_registry_url"),
        ({"value_format": "avro", "schema_registry_url": "http://r", "schema_registry_timeout_s": 0},
         "schema_registry_timeout_s:"),
    ],
)  # fmt: skip
def test_each_bad_field_is_named(fields: dict[str, object], named: str) -> None:
    with pytest.raises((StreamGroupConfigError, ValueError)) as info:
        kafka(**fields)
    assert named in str(info.value)


def test_credentials_never_reach_an_error_or_a_repr() -> None:
    with pytest.raises((StreamGroupConfigError, ValueError)) as info:
        kafka(value_format="avro", schema_registry_url=f"http://user:{SECRET}@registry:8081")
    assert SECRET not in str(info.value) and "schema_registry_url: holds credentials" in str(info.value)
    with pytest.raises((StreamGroupConfigError, ValueError)) as info:
        kafka(value_format="avro", schema_registry_url="http://r", schema_registry_basic_auth_user_info=SECRET)
    assert SECRET not in str(info.value) and "schema_registry_basic_auth_user_info: must be USER:PASSWORD" in str(
        info.value
    )
    resource = kafka(
        value_format="avro", schema_registry_url="http://r", schema_registry_basic_auth_user_info=f"u:{SECRET}"
    )
    config = resource.format_config()
    assert SECRET not in repr(resource) and SECRET not in repr(config) and SECRET not in str(config)
    options = config.to_options()
    assert SECRET not in options["formats"], "the configuration's JSON holds no secret"
    secret_options = [name for name, value in options.items() if SECRET in value]
    assert secret_options == [SECRET_OPTION_NAMES[0]]
    for name in SECRET_OPTION_NAMES:  # Spark redacts these option names by its default pattern, and we by ours
        assert re.search(SPARK_DEFAULT_REDACTION, name)
        shown = re.sub(SECRET_REDACTION_REGEX, "*****", f'key: "{name}"\nvalue: "{SECRET}"')
        assert SECRET not in shown, shown
    assert FormatConfig.from_options(options) == config, "a task rebuilds the same configuration"


def test_a_v3io_stream_has_no_key_to_decode() -> None:
    with pytest.raises(ValueError, match="key_format: a v3io record has no key"):
        V3ioStreamGroup(group="g", endpoint="http://127.0.0.1:1", container="c", stream_path="s", access_key="k",
                        key_format="string")  # fmt: skip


def test_secret_files_are_read_when_used(tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "user-info"
    path.write_text(f"u:{SECRET}\n")
    config = kafka(
        value_format="avro", schema_registry_url="http://r", schema_registry_basic_auth_user_info_file=str(path)
    ).format_config()
    assert config.registry is not None and config.registry.client_config()["basic.auth.user.info"] == f"u:{SECRET}"
    assert all(SECRET not in value for value in config.to_options().values()), "a file travels as its path"
