"""The stream's librdkafka settings translated for Spark's Kafka source (the Java client): what carries over, and
what is refused by name so that the run reads through the Python source instead."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import SecretStr

from dagster_streamgroup.dagster import KafkaStreamGroup
from dagster_streamgroup.spark.ranges import ShardRange
from dagster_streamgroup.spark.spark_kafka_source import SparkKafkaUnsupportedError, java_client_options, read_options
from dagster_streamgroup.streams.kafka_config import KafkaStreamConfig


def test_plaintext_reads_committed_records_only_by_default() -> None:
    options = java_client_options(KafkaStreamConfig(bootstrap_servers="b:9092", topics=["t"]))
    assert options == {
        "kafka.bootstrap.servers": "b:9092",
        "kafka.security.protocol": "PLAINTEXT",
        "kafka.isolation.level": "read_committed",
    }


def test_a_users_isolation_level_and_shared_properties_carry_over() -> None:
    config = KafkaStreamConfig(
        bootstrap_servers="b:9092",
        topics=["t"],
        properties={"isolation.level": "read_uncommitted", "client.id": "c", "fetch.wait.max.ms": 50},
    )
    options = java_client_options(config)
    assert options["kafka.isolation.level"] == "read_uncommitted"
    assert options["kafka.client.id"] == "c"
    assert options["kafka.fetch.max.wait.ms"] == "50"


def test_scram_over_tls_becomes_a_jaas_login_and_a_pem_trust_store(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    config = KafkaStreamConfig(
        bootstrap_servers="b:9093",
        topics=["t"],
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="user",
        sasl_password=SecretStr('pa"ss'),
        ssl_ca_location=ca,
    )
    options = java_client_options(config)
    assert options["kafka.sasl.mechanism"] == "SCRAM-SHA-512"
    assert options["kafka.sasl.jaas.config"] == (
        'org.apache.kafka.common.security.scram.ScramLoginModule required username="user" password="pa\\"ss";'
    )
    assert options["kafka.ssl.truststore.type"] == "PEM"
    assert options["kafka.ssl.truststore.location"] == str(ca)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"properties": {"queued.min.messages": 1000}}, "queued.min.messages"),
        (
            {
                "security_protocol": "SASL_SSL",
                "sasl_mechanism": "OAUTHBEARER",
                "oauthbearer_client_id": "c",
                "oauthbearer_client_secret": SecretStr("s"),
                "oauthbearer_token_endpoint_url": "https://idp/token",
            },
            "OAUTHBEARER",
        ),
    ],
    ids=["a librdkafka-only property", "OAUTHBEARER"],
)
def test_settings_without_a_translation_are_refused_by_name(fields: dict[str, object], named: str) -> None:
    config = KafkaStreamConfig(bootstrap_servers="b:9092", topics=["t"], **fields)  # type: ignore[arg-type]
    with pytest.raises(SparkKafkaUnsupportedError, match=named):
        java_client_options(config)


def test_a_client_certificate_is_refused_by_name(tmp_path: Path) -> None:
    for name in ("c.pem", "k.pem"):
        (tmp_path / name).write_text("x")
    config = KafkaStreamConfig(
        bootstrap_servers="b:9093",
        topics=["t"],
        security_protocol="SSL",
        ssl_certificate_location=tmp_path / "c.pem",
        ssl_key_location=tmp_path / "k.pem",
    )
    with pytest.raises(SparkKafkaUnsupportedError, match=r"ssl\.certificate\.location"):
        java_client_options(config)


def test_the_read_options_name_exact_offsets_per_partition() -> None:
    config = KafkaStreamConfig(bootstrap_servers="b:9092", topics=["a", "b"])
    options = read_options(
        config, [ShardRange("a:0", 5, 9), ShardRange("b:3", 0, 4), ShardRange("a:2", 1, 1)], max_records_per_partition=7
    )
    assert json.loads(options["assign"]) == {"a": [0, 2], "b": [3]}
    assert json.loads(options["startingOffsets"]) == {"a": {"0": 5, "2": 1}, "b": {"3": 0}}
    assert json.loads(options["endingOffsets"]) == {"a": {"0": 9, "2": 1}, "b": {"3": 4}}
    assert options["includeHeaders"] == "true"
    assert options["failOnDataLoss"] == "true", "a range the log no longer holds fails, never a short DataFrame"
    assert options["maxRecordsPerPartition"] == "7"


def test_an_unknown_spark_reader_fails_at_load_naming_the_field() -> None:
    with pytest.raises(Exception, match="spark_reader: must be one of auto, spark-kafka, python"):
        KafkaStreamGroup(
            group="g",
            bootstrap_servers="b:9092",
            topics=["t"],
            store_url="sqlite:////tmp/unused-state.db",
            spark_reader="jvm",
        ).process_config_and_initialize()
