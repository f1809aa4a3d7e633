"""Kafka-specific behaviour of the backend against the real local broker (or STREAMGROUP_KAFKA_BOOTSTRAP)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, OffsetSpec

from dagster_streamgroup.local.kafka_data import delete_topics, produce_records, produce_sample
from dagster_streamgroup.member import GroupMember
from dagster_streamgroup.protocol import GroupPolicy
from dagster_streamgroup.stores.memory import MemoryStore
from dagster_streamgroup.streams.base import (
    CommitRejectedError,
    OffsetOutOfRangeError,
    RangeIncompleteError,
    StreamError,
)
from dagster_streamgroup.streams.kafka import KAFKA_ARROW_SCHEMA, KafkaBackend, PartitionRange, read_ranges
from dagster_streamgroup.streams.kafka_config import KafkaStreamConfig
from tests.fixtures.kafka import TopicFactory, unique_name
from tests.fixtures.kafka_tools import reset_with_kafkas_tool, topic_id

pytestmark = pytest.mark.kafka


def _backend(bootstrap: str, *topics: str, stall_timeout_s: float = 2.0) -> KafkaBackend:
    config = KafkaStreamConfig(bootstrap_servers=bootstrap, topics=list(topics))
    return KafkaBackend(config, stall_timeout_s=stall_timeout_s)


def _table(batches: Iterator[pa.RecordBatch]) -> pa.Table:
    return pa.Table.from_batches(list(batches), schema=KAFKA_ARROW_SCHEMA)


def test_shards_span_all_topics_in_config_order(kafka_bootstrap: str, kafka_topics: TopicFactory) -> None:
    b = kafka_topics(3, prefix="b")
    a = kafka_topics(2, prefix="a")
    backend = _backend(kafka_bootstrap, b, a)
    assert backend.shards() == [f"{b}:0", f"{b}:1", f"{b}:2", f"{a}:0", f"{a}:1"]
    produce_records(kafka_bootstrap, a, 1, [b"x", b"y"])
    marks = backend.watermarks(backend.shards())
    assert marks[f"{a}:1"].high == 2
    assert marks[f"{b}:2"].high == 0


def test_a_missing_topic_and_a_foreign_shard_are_clear_errors(kafka_bootstrap: str, kafka_topics: TopicFactory) -> None:
    topic = kafka_topics(1)
    with pytest.raises(StreamError, match="does not exist"):
        _backend(kafka_bootstrap, topic, unique_name("missing")).shards()
    backend = _backend(kafka_bootstrap, topic)
    assert backend.watermarks([f"{topic}:0", "other:0"]).keys() == {f"{topic}:0"}, "a missing topic's shard has none"
    listing = backend.listing()
    assert listing.missing == frozenset() and listing.shards == [f"{topic}:0"]
    missing = _backend(kafka_bootstrap, topic, "other")
    assert missing.listing().missing == {"other"}, "a tick goes on without a missing topic (its shards are parked)"
    with pytest.raises(ValueError, match="is not '<topic>:<partition>'"):
        backend.watermarks([topic])
    with pytest.raises(ValueError, match="offset must be an int >= 0"):
        backend.commit("g", {f"{topic}:0": -1})


def test_partitions_added_later_appear_as_new_shards(kafka_bootstrap: str, kafka_topics: TopicFactory) -> None:
    topic = kafka_topics(2)
    backend = _backend(kafka_bootstrap, topic)
    assert backend.shards() == [f"{topic}:0", f"{topic}:1"]
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_partitions([NewPartitions(topic, 4)])[topic].result()
    deadline = time.monotonic() + 10
    while len(backend.shards()) < 4 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert backend.shards() == [f"{topic}:{p}" for p in range(4)]


def test_records_keep_keys_headers_and_timestamps(kafka_bootstrap: str, kafka_topics: TopicFactory) -> None:
    topic = kafka_topics(1)
    # A minute ago: records older than the topic's retention (7 days) go at the broker's next check (every second).
    base_ms = time.time_ns() // 1_000_000 - 60_000
    stamps = [base_ms + 123, base_ms + 456, base_ms + 789]
    offsets = produce_records(
        kafka_bootstrap,
        topic,
        0,
        [b"v0", None, b"v2"],
        keys=[b"k0", b"k1", None],
        timestamps_ms=stamps,
        headers=[[("h", b"1"), ("n", None)], None, []],
    )
    rows = _table(_backend(kafka_bootstrap, topic).read_range(f"{topic}:0", 0, offsets[-1] + 1)).to_pylist()
    assert [r["value"] for r in rows] == [b"v0", None, b"v2"]
    assert [r["key"] for r in rows] == [b"k0", b"k1", None]
    assert [r["offset"] for r in rows] == offsets
    assert {(r["topic"], r["partition"]) for r in rows} == {(topic, 0)}
    assert [round(r["timestamp"].timestamp() * 1000) for r in rows] == stamps
    assert [r["timestampType"] for r in rows] == [0, 0, 0]  # Spark's code for CreateTime
    assert rows[0]["headers"] == [{"key": "h", "value": b"1"}, {"key": "n", "value": None}]
    assert rows[1]["headers"] is None


def test_transaction_markers_do_not_stall_a_range(kafka_bootstrap: str, kafka_topics: TopicFactory) -> None:
    """Offsets taken by commit markers hold no records: a range ending on one completes at once."""
    topic = kafka_topics(1)
    producer = Producer(
        {"bootstrap.servers": kafka_bootstrap, "transactional.id": unique_name("tx"), "batch.num.messages": 1}
    )
    producer.init_transactions(10)
    for txn in range(3):
        producer.begin_transaction()
        for i in range(4):
            producer.produce(topic, f"t{txn}-{i}".encode(), partition=0)
        producer.commit_transaction(10)
    backend = _backend(kafka_bootstrap, topic, stall_timeout_s=20.0)
    high = backend.watermarks([f"{topic}:0"])[f"{topic}:0"].high
    assert high > 12, "commit markers take offsets"
    started = time.monotonic()
    table = _table(backend.read_range(f"{topic}:0", 0, high))
    assert time.monotonic() - started < 10, "the end-of-partition event must finish the range, not the stall timeout"
    assert table.column("value").to_pylist() == [f"t{t}-{i}".encode() for t in range(3) for i in range(4)]
    offsets = table.column("offset").to_pylist()
    assert len(set(offsets)) == 12 and offsets == sorted(offsets)
    # the real offsets, gaps included: a batch whose first and last offsets are not len - 1 apart is not a run
    assert offsets[3] + 1 < offsets[4] and offsets[7] + 1 < offsets[8], offsets
    # a range that ends right after the first transaction's records, on its marker
    first = _table(backend.read_range(f"{topic}:0", 0, offsets[4]))
    assert first.column("value").to_pylist() == [f"t0-{i}".encode() for i in range(4)]


def test_several_ranges_in_one_read(kafka_bootstrap: str, kafka_topics: TopicFactory) -> None:
    a = kafka_topics(3, prefix="a")
    b = kafka_topics(1, prefix="b")
    ends_a = produce_sample(kafka_bootstrap, a, 3, 3000, value_size=10)
    produce_records(kafka_bootstrap, b, 0, [b"b0", b"b1", b"b2"])
    ranges = [
        PartitionRange(a, 0, 10, 900),
        PartitionRange(a, 1, 0, ends_a[1]),
        PartitionRange(a, 2, 5, 5),
        PartitionRange(b, 0, 1, 3),
    ]
    table = _table(read_ranges({"bootstrap.servers": kafka_bootstrap}, ranges, batch_size=333))
    got = {(t, p): [] for t, p in {(r.topic, r.partition) for r in ranges}}
    for row in table.select(["topic", "partition", "offset"]).to_pylist():
        got[(row["topic"], row["partition"])].append(row["offset"])
    assert got[(a, 0)] == list(range(10, 900))
    assert got[(a, 1)] == list(range(ends_a[1]))
    assert got[(a, 2)] == []
    assert got[(b, 0)] == [1, 2]


def test_ranges_of_several_partitions_of_one_topic(kafka_bootstrap: str, kafka_topics: TopicFactory) -> None:
    """One topic read over several partitions: batches mix partitions, and ranges end below the watermarks,
    so records past an end arrive and must be dropped from the batch they came in."""
    topic = kafka_topics(3)
    ends = produce_sample(kafka_bootstrap, topic, 3, 6000, value_size=10)
    ranges = [PartitionRange(topic, 0, 7, 1500), PartitionRange(topic, 1, 0, 1), PartitionRange(topic, 2, 100, ends[2])]
    for batch_size in (1, 97, 10_000):
        table = _table(read_ranges({"bootstrap.servers": kafka_bootstrap}, ranges, batch_size=batch_size))
        got: dict[int, list[int]] = {0: [], 1: [], 2: []}
        for row in table.select(["topic", "partition", "offset"]).to_pylist():
            assert row["topic"] == topic
            got[row["partition"]].append(row["offset"])
        assert got == {0: list(range(7, 1500)), 1: [0], 2: list(range(100, ends[2]))}, batch_size


def test_commits_are_visible_to_kafka_lag_tools(kafka_bootstrap: str, kafka_topics: TopicFactory) -> None:
    topic = kafka_topics(2)
    group = unique_name("g")
    backend = _backend(kafka_bootstrap, topic)
    backend.commit(group, {f"{topic}:0": 4, f"{topic}:1": 0})
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": group})
    try:
        seen = consumer.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=10)
    finally:
        consumer.close()
    assert [tp.offset for tp in seen] == [4, 0]


def test_a_group_whose_state_was_lost_resumes_at_its_kafka_offsets(
    kafka_bootstrap: str, kafka_topics: TopicFactory
) -> None:
    """A new state store (or a changed bootstrap list, which keys a new state) does not reprocess the topic
    from the start nor skip its backlog: the shards start at the offsets mirrored into Kafka's group."""
    topic = kafka_topics(2)
    ends = produce_sample(kafka_bootstrap, topic, 2, 400)
    group = unique_name("g")
    backend = _backend(kafka_bootstrap, topic)
    backend.commit(group, {f"{topic}:0": 150})  # partition 1: nothing committed in Kafka
    policy = GroupPolicy(join_grace_s=0, max_records_per_run=1000, seek="latest", min_backlog=1)
    member = GroupMember(MemoryStore(time.time), backend, group, "m", policy)
    starts = {launch.shard: (launch.start, launch.end) for launch in member.tick().new_launches}
    assert starts == {f"{topic}:0": (150, ends[0])}  # partition 1 follows the seek policy: latest, no backlog
    state = member.load()
    assert state is not None and state.shards[f"{topic}:1"].committed == ends[1]


def test_a_new_group_starts_at_a_timestamp(kafka_bootstrap: str, kafka_topics: TopicFactory) -> None:
    """seek='timestamp': the member looks up the first offset at or after the time (the broker's
    offsets-for-times) and the group starts there, as Spark's startingTimestamp does."""
    topic = kafka_topics(1)
    produce_records(kafka_bootstrap, topic, 0, [b"old-1", b"old-2"])
    time.sleep(1.2)  # the local broker looks times up by write time: space the two batches out
    since = int(time.time() * 1000)
    time.sleep(0.2)
    produce_records(kafka_bootstrap, topic, 0, [b"new-1", b"new-2", b"new-3"])
    backend = _backend(kafka_bootstrap, topic)
    policy = GroupPolicy(join_grace_s=0, seek="timestamp", seek_timestamp_ms=since, min_backlog=1)
    member = GroupMember(MemoryStore(time.time), backend, unique_name("g"), "m", policy)
    [launch] = member.tick().new_launches
    high = backend.watermarks([f"{topic}:0"])[f"{topic}:0"].high
    assert (launch.start, launch.end) == (backend.offset_for_time(f"{topic}:0", since), high)
    values = _table(backend.read_range(f"{topic}:0", launch.start, launch.end)).column("value").to_pylist()
    assert values[0] == b"new-1" and b"old-2" not in values


def test_a_commit_into_a_group_with_live_subscribers_is_rejected(
    kafka_bootstrap: str, kafka_topics: TopicFactory
) -> None:
    topic = kafka_topics(1)
    group = unique_name("live")
    produce_records(kafka_bootstrap, topic, 0, [b"a"])
    member = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 10_000,
            "heartbeat.interval.ms": 500,
        }
    )
    try:
        member.subscribe([topic])
        deadline = time.monotonic() + 30
        while not member.assignment() and time.monotonic() < deadline:
            member.poll(0.2)
        assert member.assignment(), "the subscriber never joined"
        with pytest.raises(CommitRejectedError, match="live subscribe\\(\\) members") as caught:
            _backend(kafka_bootstrap, topic).commit(group, {f"{topic}:0": 1})
        cause = caught.value.__cause__
        assert isinstance(cause, KafkaException)
        assert cause.args[0].code() == KafkaError.UNKNOWN_MEMBER_ID
    finally:
        member.close()


def test_retention_loss_raises_offset_out_of_range(kafka_bootstrap: str, kafka_topics: TopicFactory) -> None:
    """Records below the log start offset (DeleteRecords, as retention would) are gone: a range that starts
    there fails with the low watermark and the lost offsets, never silently from the first record left."""
    topic = kafka_topics(1)
    ends = produce_sample(kafka_bootstrap, topic, 1, 1_000, value_size=10)
    high = ends[0]
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for future in admin.delete_records([TopicPartition(topic, 0, 600)]).values():
        future.result(30)
    backend = _backend(kafka_bootstrap, topic)
    mark = backend.watermarks([f"{topic}:0"])[f"{topic}:0"]
    assert (mark.low, mark.high) == (600, high)
    config = {"bootstrap.servers": kafka_bootstrap}
    with pytest.raises(OffsetOutOfRangeError) as caught:
        list(read_ranges(config, [PartitionRange(topic, 0, 0, high)]))
    assert caught.value.low == 600
    assert "[0, 600)" in str(caught.value)
    assert sum(b.num_rows for b in read_ranges(config, [PartitionRange(topic, 0, 600, high)])) == high - 600


def test_an_admin_client_whose_request_failed_is_replaced(kafka_bootstrap: str, kafka_topics: TopicFactory) -> None:
    """A long-lived client can stay stuck on a restarted broker's connection; a failed request drops it, so
    the next call talks through a new one. (No broker at the first address: its requests fail for real.)"""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{probe.getsockname()[1]}"  # nothing listens once the probe closes
    topic = kafka_topics(partitions=1)
    backend = KafkaBackend(KafkaStreamConfig(bootstrap_servers=closed, topics=[topic]), request_timeout_s=1.0)
    with pytest.raises(StreamError, match="listing the stream's partitions"):
        backend.shards()
    assert backend._admin is None, "the failed client is not kept"
    backend.config = KafkaStreamConfig(bootstrap_servers=kafka_bootstrap, topics=[topic])  # the broker is back
    assert backend.shards() == [f"{topic}:0"]
    assert backend._admin is not None


def test_a_failed_call_on_one_thread_leaves_another_threads_request_and_the_successor_client(
    kafka_bootstrap: str, kafka_topics: TopicFactory
) -> None:
    """The backend is shared by the ticks of a code server's sensors, in threads. A call that fails drops the
    cached client, but a request another thread has in flight on it still gets its answer (librdkafka fails
    the requests of a client destroyed under them), and a failure that thread then sees does not drop the
    client that replaced it. (The failures are raised inside the calls: a broker cannot be made to fail one
    thread's request and answer another's on the same client.)"""
    topic = kafka_topics(partitions=2)
    backend = _backend(kafka_bootstrap, topic)
    first_thread = pytest.raises(StreamError, match="the first thread's request")
    with first_thread, backend._admin_call("the first thread's request") as first:
        futures = first.list_offsets({TopicPartition(topic, 0): OffsetSpec.latest()}, request_timeout=10)
        with (
            pytest.raises(StreamError, match="the second thread's request"),
            backend._admin_call("the second thread's request"),
        ):
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))
        assert backend._admin is None, "the client whose request failed is kept"
        assert [f.result().offset for f in futures.values()] == [0]
        successor = backend.admin
        assert successor is not first
        raise KafkaException(KafkaError(KafkaError._TRANSPORT))  # the first thread's next request fails too
    assert backend._admin is successor, "a failure seen through the dropped client dropped its successor"
    assert backend.shards() == [f"{topic}:0", f"{topic}:1"]


def test_a_range_past_the_end_of_its_partition_names_that_end_not_retention(
    kafka_bootstrap: str, kafka_topics: TopicFactory
) -> None:
    """A range beyond what a partition holds (the topic was recreated shorter, or truncated) fails at once, naming
    the partition's end; it used to be an ``OffsetOutOfRangeError`` that blamed retention, with the earliest offset
    (0) given as where the records would be."""
    topic = kafka_topics(1)
    [end] = produce_sample(kafka_bootstrap, topic, 1, 10).values()
    backend = _backend(kafka_bootstrap, topic)
    with pytest.raises(RangeIncompleteError) as caught:
        list(backend.read_range(f"{topic}:0", end + 10, end + 20))
    text = str(caught.value)
    assert f"{topic}:0" in text and f"ends at {end}" in text and "recreated" in text, text
    assert "retention" not in text, text


def test_the_mirror_marks_its_offsets_and_leaves_an_offset_something_else_wrote_for_the_tick(
    kafka_bootstrap: str, kafka_topics: TopicFactory
) -> None:
    """The members' commits carry ``streamgroup:1:<topic id>`` in their metadata, and Kafka keeps it: the admin
    client's ListConsumerGroupOffsets shows it as the consumer's OffsetFetch does (what ``group_offsets`` reads).
    An offset committed without it (as Kafka's consumer-groups tool commits, and another application) is not
    overwritten by a run's mirror, monotonic or not, so that the next tick sees it; ``restore`` writes over it."""
    from confluent_kafka import ConsumerGroupTopicPartitions

    topic = kafka_topics(1)
    shard = f"{topic}:0"
    produce_sample(kafka_bootstrap, topic, 1, 50)
    backend = _backend(kafka_bootstrap, topic)
    group = unique_name("g")
    identity = topic_id(kafka_bootstrap, topic)
    backend.commit(group, {shard: 20}, identities={shard: identity})
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    listed = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result()
    [tp] = listed.topic_partitions
    assert (tp.offset, tp.metadata) == (20, f"streamgroup:1:{identity}")
    mirrored = backend.group_offsets(group, [shard])[shard]
    assert mirrored is not None and mirrored.ours and mirrored.identity == identity and mirrored.offset == 20
    reset_with_kafkas_tool(kafka_bootstrap, group, topic, "--to-offset", "5")
    tool = backend.group_offsets(group, [shard])[shard]
    assert tool is not None and (tool.offset, tool.ours) == (5, False), "the tool writes no marker"
    assert backend.commit(group, {shard: 30}) == {shard: 5} and backend.committed(group, [shard]) == {shard: 5}
    backend.commit(group, {shard: 30}, identities={shard: identity}, restore=True)
    assert backend.group_offsets(group, [shard])[shard] == mirrored._replace(offset=30)
    assert backend.commit(group, {shard: 40}, identities={shard: "another-topic-id"}) == {}, "a deleted log's offset"
    assert backend.committed(group, [shard]) == {shard: 30}


def test_a_topic_deleted_under_the_mirror_costs_only_its_own_offsets(
    kafka_bootstrap: str, kafka_topics: TopicFactory
) -> None:
    """A topic deleted between the mirror's identity check and its commit (a run's commit racing an operator) made
    the whole OffsetCommit fail with UNKNOWN_TOPIC_OR_PART, and the offsets of the other topics in it were not
    mirrored either: a group state lost after that resumed them from an older mirror, reading records twice. Here
    the race is set up without timing: a shard given no identity is taken as current, so its deleted topic reaches
    the commit."""
    live, doomed = kafka_topics(1), kafka_topics(1)
    produce_sample(kafka_bootstrap, live, 1, 20)
    produce_sample(kafka_bootstrap, doomed, 1, 20)
    backend = _backend(kafka_bootstrap, live)
    group = unique_name("g")
    delete_topics(kafka_bootstrap, [doomed])
    deadline = time.monotonic() + 30
    while backend.identities([f"{doomed}:0"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not backend.identities([f"{doomed}:0"]), "the topic was not deleted"
    live_id = topic_id(kafka_bootstrap, live)
    mirrored = backend.commit(
        group, {f"{live}:0": 12, f"{doomed}:0": 7}, identities={f"{live}:0": live_id, f"{doomed}:0": None}
    )
    assert mirrored == {f"{live}:0": 12}
    assert backend.committed(group, [f"{live}:0"]) == {f"{live}:0": 12}
    assert backend.group_offsets(group, [f"{live}:0", f"{doomed}:0"]) == {
        f"{live}:0": backend.group_offsets(group, [f"{live}:0"])[f"{live}:0"],
        f"{doomed}:0": None,
    }, "reading the group's offsets of a deleted topic"
