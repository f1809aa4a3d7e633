"""The SASL_SSL listener of Apache Kafka (SCRAM-SHA-512, a CA made for the test session): member ticks and the
Spark read (through either reader: the Java client's SASL login and PEM trust store are translated from the
stream's settings) with the password from ``dagster.EnvVar``; a wrong password or an untrusted certificate fails a
tick and a run's read within the request timeout plus a few seconds, never a hang, with an error that names
the field to check."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from pyspark.sql import SparkSession

from dagster_streamgroup.dagster import KafkaStreamGroup
from dagster_streamgroup.local.kafka_broker import BrokerInfo
from dagster_streamgroup.local.kafka_data import produce_sample
from dagster_streamgroup.protocol import report_of
from dagster_streamgroup.streams.base import StreamError
from tests.fixtures.kafka import SASL_PASSWORD, SASL_USER, TopicFactory, unique_name

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

REQUEST_TIMEOUT_S = 10.0
"""The backend's request timeout: a refused login must fail within it plus a few seconds."""
PASSWORD_ENV = "STREAMGROUP_TEST_SASL_PASSWORD"


def sasl_resource(broker: BrokerInfo, topic: str, tmp_path: Path, *, ca: Path | None, **extra: Any) -> KafkaStreamGroup:
    if broker.sasl_bootstrap is None:
        pytest.skip("the external cluster named by STREAMGROUP_KAFKA_BOOTSTRAP has no SASL_SSL listener of ours")
    return KafkaStreamGroup(
        group=unique_name("sasl"),
        bootstrap_servers=broker.sasl_bootstrap,
        topics=[topic],
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username=SASL_USER,
        sasl_password=dg.EnvVar(PASSWORD_ENV),
        ssl_ca_location=None if ca is None else str(ca),
        store_url=f"sqlite:///{tmp_path / 'state.db'}",
        heartbeat_interval_s=1.0,
        join_grace_s=0.0,
        min_backlog=1,
        max_wait_s=0.0,
        **extra,
    )


@pytest.mark.parametrize("reader", ["python", "spark-kafka"])
def test_ticks_and_the_spark_source_read_through_sasl_ssl_with_the_password_from_an_env_var(
    kafka_broker: BrokerInfo, kafka_topics: TopicFactory, spark: SparkSession, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, reader: str,
) -> None:  # fmt: skip
    topic = kafka_topics(2)
    ends = produce_sample(kafka_broker.bootstrap, topic, 2, 1_000)
    monkeypatch.setenv(PASSWORD_ENV, SASL_PASSWORD)
    resource = sasl_resource(
        kafka_broker, topic, tmp_path, ca=kafka_broker.ca_file, spark_reader=reader
    ).process_config_and_initialize()
    member = resource.member("m0")
    launches = member.tick().new_launches
    assert {x.shard: (x.start, x.end) for x in launches} == {f"{topic}:{p}": (0, e) for p, e in ends.items()}
    df = resource.read_ranges(spark, {x.shard: (x.start, x.end) for x in launches})
    assert df.count() == sum(ends.values())
    for launch in launches:
        assert member.commit(report_of(launch)).accepted
    assert SASL_PASSWORD not in repr(resource) and SASL_PASSWORD not in df._jdf.queryExecution().toString()


@pytest.mark.parametrize(
    ("password", "trusted", "field"),
    [("not-the-password", True, "sasl_password"), (SASL_PASSWORD, False, "ssl_ca_location")],
    ids=["wrong password", "untrusted certificate"],
)
def test_a_refused_login_fails_a_tick_and_a_read_quickly_naming_the_field(
    kafka_broker: BrokerInfo, kafka_topics: TopicFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    password: str, trusted: bool, field: str,
) -> None:  # fmt: skip
    topic = kafka_topics(1)
    produce_sample(kafka_broker.bootstrap, topic, 1, 100)
    monkeypatch.setenv(PASSWORD_ENV, password)
    resource = sasl_resource(kafka_broker, topic, tmp_path, ca=kafka_broker.ca_file if trusted else None)
    resource = resource.process_config_and_initialize()
    started = time.monotonic()
    with pytest.raises(StreamError, match=field) as tick_error:
        resource.member("m0").tick()
    assert time.monotonic() - started < REQUEST_TIMEOUT_S + 5, "the tick hung"
    assert password not in str(tick_error.value)
    started = time.monotonic()
    with pytest.raises(StreamError, match=field) as read_error:
        list(resource.backend().read_range(f"{topic}:0", 0, 50))
    assert time.monotonic() - started < REQUEST_TIMEOUT_S + 5, "the read hung"
    assert password not in str(read_error.value)
