"""The local broker launcher and the data producer, against the real binary."""

from __future__ import annotations

import os

import pytest
from confluent_kafka.admin import AdminClient

from dagster_streamgroup.local.kafka_broker import BrokerStartError, free_port, running_broker, wait_until_answering
from dagster_streamgroup.local.kafka_data import produce_sample
from dagster_streamgroup.streams.kafka import KafkaBackend
from dagster_streamgroup.streams.kafka_config import KafkaStreamConfig
from tests.fixtures.kafka import TopicFactory

pytestmark = pytest.mark.kafka


def test_a_broker_starts_on_a_free_loopback_port_and_is_stopped_by_pid() -> None:
    with running_broker() as broker:
        assert broker.bootstrap.startswith("127.0.0.1:")
        assert broker.pid is not None
        os.kill(broker.pid, 0)  # alive
        metadata = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=10)
        assert [b.host for b in metadata.brokers.values()] == ["127.0.0.1"]
    with pytest.raises(ProcessLookupError):
        os.kill(broker.pid, 0)


def test_waiting_for_a_broker_that_is_not_listening_logs_no_connection_errors(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """librdkafka writes a "Connection refused" line to stderr for each reconnect of a client created too
    early; on every start of the example those lines read like a failure."""
    silent = f"127.0.0.1:{free_port()}"
    with pytest.raises(BrokerStartError, match="nothing listens on the port"):
        wait_until_answering(silent, timeout_s=0.5)
    with running_broker() as broker:
        pass
    # stderr is the whole process's: clients of other tests log about their own addresses
    ours = [line for line in capfd.readouterr().err.splitlines() if silent in line or broker.bootstrap in line]
    assert not [line for line in ours if "Connection refused" in line]


def test_sample_data_ends_each_partition_so_watermarks_are_exact(
    kafka_bootstrap: str, kafka_topics: TopicFactory
) -> None:
    topic = kafka_topics(4)
    ends = produce_sample(kafka_bootstrap, topic, 4, 20_000, value_size=10)
    assert sum(ends.values()) == 20_004  # the records plus one trailing record per partition
    backend = KafkaBackend(KafkaStreamConfig(bootstrap_servers=kafka_bootstrap, topics=[topic]))
    marks = backend.watermarks(backend.shards())
    assert {int(s.rsplit(":", 1)[1]): m.high for s, m in marks.items()} == ends
