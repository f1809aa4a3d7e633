"""Another application's Kafka consumer group with the same name: held by live consumers (classic protocol and
KIP-848), or owned while its consumers are stopped. Every member tick refuses it and launches nothing; only an
explicit ``adopt_group_offsets`` takes an owned, empty group over, starting from its offsets."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from confluent_kafka import Consumer, TopicPartition

from dagster_streamgroup.local.kafka_data import produce_sample
from dagster_streamgroup.protocol import report_of
from dagster_streamgroup.stores.memory import MemoryStore
from dagster_streamgroup.streams.base import ForeignGroupError
from dagster_streamgroup.streams.kafka import KafkaBackend
from dagster_streamgroup.streams.kafka_config import KafkaStreamConfig
from tests.fixtures.kafka import TopicFactory, unique_name
from tests.reliability.conftest import kafka_backend, member_of

pytestmark = pytest.mark.kafka


@contextmanager
def subscribed(bootstrap: str, group: str, topic: str, protocol: str) -> Iterator[Consumer]:
    """A consumer of another application, subscribed to ``topic`` in ``group``, polled until it has partitions."""
    config = {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
    if protocol == "consumer":
        config["group.protocol"] = "consumer"
    else:
        config["session.timeout.ms"] = 6000
    consumer = Consumer(config)
    consumer.subscribe([topic])
    try:
        deadline = time.monotonic() + 45
        while not consumer.assignment():
            assert time.monotonic() < deadline, "the other application's consumer got no partitions"
            consumer.poll(0.2)
        yield consumer
    finally:
        consumer.close()


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_a_group_with_live_consumers_is_refused_by_every_tick(
    kafka_bootstrap: str, kafka_topics: TopicFactory, protocol: str
) -> None:
    topic = kafka_topics(2)
    produce_sample(kafka_bootstrap, topic, 2, 100)
    group = unique_name("shared")
    store = MemoryStore(time.time)
    member = member_of(store, kafka_backend(kafka_bootstrap, topic), group)
    with subscribed(kafka_bootstrap, group, topic, protocol) as other:
        ids = {str(m.member_id) for m in _describe(kafka_bootstrap, group).members}
        assert ids
        for _ in range(2):
            with pytest.raises(ForeignGroupError) as caught:
                member.tick()
            message = str(caught.value)
            assert repr(group) in message and all(i in message for i in ids), message
            assert ("CONSUMER" if protocol == "consumer" else "CLASSIC") in message
        assert member.load() is None, "a refused tick writes nothing and launches nothing"
        assert other.assignment()


def test_an_empty_group_another_application_owns_is_refused_unless_adopted(
    kafka_bootstrap: str, kafka_topics: TopicFactory
) -> None:
    topic = kafka_topics(1)
    produce_sample(kafka_bootstrap, topic, 1, 100)
    group = unique_name("owned")
    with subscribed(kafka_bootstrap, group, topic, "classic") as other:
        other.commit(offsets=[TopicPartition(topic, 0, 40)], asynchronous=False)
    member = member_of(MemoryStore(time.time), kafka_backend(kafka_bootstrap, topic), group)
    with pytest.raises(ForeignGroupError, match="adopt_group_offsets"):
        member.tick()
    assert member.load() is None

    config = KafkaStreamConfig(bootstrap_servers=kafka_bootstrap, topics=[topic], adopt_group_offsets=True)
    adopting = member_of(MemoryStore(time.time), KafkaBackend(config, request_timeout_s=5.0), group)
    [launch] = adopting.tick().new_launches
    assert launch.start == 40, "an adopted group starts from the other application's offsets"
    adopting.commit(report_of(launch))


def test_our_own_mirrored_group_is_not_taken_for_a_foreign_one(
    kafka_bootstrap: str, kafka_topics: TopicFactory
) -> None:
    topic = kafka_topics(1)
    produce_sample(kafka_bootstrap, topic, 1, 100)
    group = unique_name("ours")
    backend = kafka_backend(kafka_bootstrap, topic)
    member = member_of(MemoryStore(time.time), backend, group)
    [launch] = member.tick().new_launches
    member.commit(report_of(launch))
    backend.commit(group, {launch.shard: launch.end})  # the mirror, as a run does after its commit
    assert _describe(kafka_bootstrap, group).is_simple_consumer_group
    fresh = member_of(MemoryStore(time.time), backend, group)  # a lost state: starts from the mirror
    report = fresh.tick()
    assert report.new_launches == [] or report.new_launches[0].start == launch.end


def _describe(bootstrap: str, group: str):  # type: ignore[no-untyped-def]
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    return admin.describe_consumer_groups([group], request_timeout=10)[group].result()


def test_only_a_group_another_application_made_is_described(
    kafka_bootstrap: str, kafka_topics: TopicFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A DescribeGroups request that times out while its coordinator lookup is in flight aborts the process in
    librdkafka 2.16 (librdkafka#4605; a restarted broker shows it, not on demand): a group that does not exist yet,
    and the assign-only group our mirror leaves, are told apart from the cluster's group list alone. A spy on
    the admin client counts the describes, since the abort itself cannot be made to happen."""
    from confluent_kafka.admin import AdminClient

    described: list[list[str]] = []
    original = AdminClient.describe_consumer_groups

    def spy(self: AdminClient, group_ids: list[str], **kwargs: object) -> object:
        described.append(list(group_ids))
        return original(self, group_ids, **kwargs)

    monkeypatch.setattr(AdminClient, "describe_consumer_groups", spy)
    topic = kafka_topics(1)
    produce_sample(kafka_bootstrap, topic, 1, 100)
    backend = kafka_backend(kafka_bootstrap, topic)
    ours = unique_name("ours")
    backend.check_group(ours)  # no such group yet
    backend.commit(ours, {f"{topic}:0": 10})
    backend.check_group(ours)  # our mirror's
    assert described == []
    owned = unique_name("owned")
    with subscribed(kafka_bootstrap, owned, topic, "classic") as other:
        other.commit(offsets=[TopicPartition(topic, 0, 40)], asynchronous=False)
    with pytest.raises(ForeignGroupError, match="adopt_group_offsets"):
        backend.check_group(owned)
    assert described == [[owned]]
