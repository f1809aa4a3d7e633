"""One local Spark session for the whole test session (starting one costs several seconds), and the records the
readers' tests compare (a module's own topic: plain records, then two with headers and a null key)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from dagster_streamgroup.local.kafka_data import produce_records, produce_sample
from dagster_streamgroup.spark.session import local_spark_session
from dagster_streamgroup.streams.kafka_config import KafkaStreamConfig
from tests.fixtures.kafka import TopicFactory


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = local_spark_session(app_name="streamgroup-tests", conf={"spark.driver.memory": "1g"})
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="module")
def data(kafka_bootstrap: str) -> Iterator[tuple[KafkaStreamConfig, str, dict[int, int]]]:
    factory = TopicFactory(kafka_bootstrap)
    topic = factory(3, prefix="spark")
    ends = produce_sample(kafka_bootstrap, topic, 3, 6000, value_size=20)
    offsets = produce_records(
        kafka_bootstrap, topic, 2, [b"h1", b"h2"], keys=[None, b"k"], headers=[[("a", b"1"), ("b", None)], None]
    )
    ends[2] = offsets[-1] + 1
    yield KafkaStreamConfig(bootstrap_servers=kafka_bootstrap, topics=[topic]), topic, ends
    factory.cleanup()
