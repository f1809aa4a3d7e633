"""What the backend contract tests need from a stream peer, kept small so every backend can provide it.

A harness creates fresh streams on a real server, appends records to one shard, and names the features its
server lacks (each contract test that needs one is skipped with the harness's reason).

To add a backend: write a harness class here, a ``<name>_stream_harness`` fixture in
test_stream_contract.py, and a ``pytest.param`` in ``STREAM_HARNESSES``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import pytest
import v3io.dataplane
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from dagster_streamgroup.local.kafka_data import produce_records
from dagster_streamgroup.local.v3io.testing import V3ioServerInfo
from dagster_streamgroup.streams.base import StreamBackend
from dagster_streamgroup.streams.kafka import KafkaBackend, parse_shard
from dagster_streamgroup.streams.kafka_config import KafkaStreamConfig
from dagster_streamgroup.streams.v3io import V3ioBackend
from dagster_streamgroup.streams.v3io_config import V3ioStreamConfig
from tests.fixtures.kafka import TopicFactory
from tests.fixtures.v3io import unique_v3io_name

STREAM_HARNESSES = [
    pytest.param("kafka", marks=pytest.mark.kafka, id="kafka"),
    pytest.param("v3io", marks=pytest.mark.v3io, id="v3io"),
]


class StreamHarness(Protocol):
    name: str
    group: str
    """A consumer-group name nobody has used yet."""
    missing: dict[str, str]
    """Features the server lacks -> why; known keys: ``"trim"``, ``"offset_for_time_future"``."""
    offset_column: str
    value_column: str
    """The batch columns holding each record's offset and payload."""

    def create_stream(self, shards: int) -> StreamBackend:
        """A new, empty stream with ``shards`` shards (a short stall timeout, so incomplete reads fail fast)."""
        ...

    def append(self, backend: StreamBackend, shard: str, values: Sequence[bytes]) -> list[int]:
        """Write records to one shard, in order, and return their offsets (visible to readers on return)."""
        ...

    def trim(self, backend: StreamBackend, shard: str, before: int) -> None:
        """Remove the shard's records below ``before``, as retention would."""
        ...


class KafkaHarness:
    name = "kafka"
    offset_column = "offset"
    value_column = "value"

    def __init__(self, bootstrap: str, topics: TopicFactory, group: str) -> None:
        self.bootstrap = bootstrap
        self.topics = topics
        self.group = group
        self.missing: dict[str, str] = {}

    def create_stream(self, shards: int) -> StreamBackend:
        topic = self.topics(shards, prefix="contract")
        return KafkaBackend(KafkaStreamConfig(bootstrap_servers=self.bootstrap, topics=[topic]), stall_timeout_s=2.0)

    def append(self, backend: StreamBackend, shard: str, values: Sequence[bytes]) -> list[int]:
        topic, partition = parse_shard(shard)
        return produce_records(self.bootstrap, topic, partition, values)

    def trim(self, backend: StreamBackend, shard: str, before: int) -> None:
        topic, partition = parse_shard(shard)
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        for future in admin.delete_records([TopicPartition(topic, partition, before)]).values():
            future.result()


class V3ioHarness:
    name = "v3io"
    offset_column = "sequence_number"
    value_column = "data"

    def __init__(self, server: V3ioServerInfo, group: str) -> None:
        self.server = server
        self.group = group
        self.missing = {
            "trim": "v3io trims by age only (RetentionPeriodHours), not below a given sequence number; "
            "tests/integration/v3io covers retention with a short-hour server",
        }
        self.container = "bigdata"

    def create_stream(self, shards: int) -> StreamBackend:
        path = unique_v3io_name("contract")
        client = v3io.dataplane.Client(**self.server.client_kwargs())
        try:
            client.stream.create(self.container, path, shard_count=shards)
        finally:
            client.close()
        config = V3ioStreamConfig(
            endpoint=self.server.endpoint,
            container=self.container,
            stream_path=path,
            access_key=self.server.access_key,
        )
        return V3ioBackend(config, stall_timeout_s=2.0)

    def append(self, backend: StreamBackend, shard: str, values: Sequence[bytes]) -> list[int]:
        assert isinstance(backend, V3ioBackend)
        client = v3io.dataplane.Client(**self.server.client_kwargs())
        try:
            out = client.stream.put_records(
                self.container, backend.config.stream_path, [{"shard_id": int(shard), "data": v} for v in values]
            ).output
        finally:
            client.close()
        assert out.failed_record_count == 0
        return [r.sequence_number for r in out.records]

    def trim(self, backend: StreamBackend, shard: str, before: int) -> None:
        raise NotImplementedError(self.missing["trim"])
