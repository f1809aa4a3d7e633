"""The peer of ``bench.peer_spark_streaming`` (Spark Structured Streaming's own Kafka source) against our range
source, on the real local broker and a real Spark session: both read the same records, and the example's
function gives the same views per partition from either.

The topic holds the example's click events on three partitions and, in the middle, a transactional
producer's aborted transaction and a committed one. The peer drains the topic with ``Trigger.AvailableNow``
under ``kafka.isolation.level=read_committed``; our side reads ``[0, end)`` of each partition, the ends being
the last stable offsets as our backend reads them. The aborted records take offsets that neither side may
return: this is where Spark's default (read_uncommitted) would differ from ours. The comparison runs in one
session (the pytest process's classic one), so it checks what is read and written, never how fast.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from pyspark.sql import DataFrame, SparkSession

from bench.peer_follow import (
    batches_committed_between,
    checkpoint_committed,
    following_peer,
    wait_committed,
)
from bench.peer_spark_streaming import (
    PeerSpec,
    await_query,
    high_watermarks,
    parse_range_directory,
    probe_sink,
    sink_views_by_shard,
    start_query,
)
from dagster_streamgroup.dagster import StreamRange, range_key
from dagster_streamgroup.spark.kafka_source import read_kafka_ranges
from dagster_streamgroup.spark.session import local_spark_session
from dagster_streamgroup.streams.kafka_config import KafkaStreamConfig
from jobs.clickstream import page_views, write_page_views
from jobs.clickstream_events import event, produce_burst, producers
from tests.fixtures.kafka import TopicFactory, unique_name

PARTITIONS = 3
CLICKS = 19_000
"""Click events before the transactions; 1,000 more after them, so the aborted offsets sit in the middle."""
ABORTED_PER_PARTITION = 150
COMMITTED_PER_PARTITION = 100
QUERY_TIMEOUT_S = 120.0

Record = tuple[int, int, bytes | None, bytes | None]
"""``(partition, offset, key, value)``."""


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    """The process's classic session (another test module's, if one is running: PySpark has one per process)."""
    existing = SparkSession.getActiveSession()
    session = local_spark_session(app_name="streamgroup-tests", conf={"spark.driver.memory": "1g"})
    try:
        yield session
    finally:
        if existing is None:
            session.stop()


def transaction(bootstrap: str, topic: str, per_partition: int, *, commit: bool) -> None:
    """One transaction of click events on every partition, committed or aborted; aborted events name their user
    ``aborted-...`` so a reader that returns one shows it."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": unique_name("peer-tx"), "linger.ms": 5})
    producer.init_transactions(30)
    producer.begin_transaction()
    rng = random.Random(per_partition)
    for partition in range(PARTITIONS):
        for i in range(per_partition):
            key, value = event(rng, 1_700_000_000_000 + i)
            if not commit:
                body = json.loads(value)
                body["user"] = f"aborted-{body['user']}"
                value = json.dumps(body, separators=(",", ":")).encode()
            producer.produce(topic, value, key, partition=partition)
    producer.flush(30)
    if commit:
        producer.commit_transaction(30)
    else:
        producer.abort_transaction(30)


def produce_clicks(bootstrap: str, topic: str, count: int, seed: int) -> None:
    bulk, trailer = producers({"bootstrap.servers": bootstrap})
    produce_burst(bulk, trailer, topic, PARTITIONS, count, random.Random(seed))


def records_of(df: DataFrame) -> list[Record]:
    rows = df.select("partition", "offset", "key", "value").collect()
    return sorted(
        (int(r["partition"]), int(r["offset"]), bytes(r["key"]) if r["key"] is not None else None, bytes(r["value"]))
        for r in rows
    )


def test_the_probe_reads_back_every_range_key() -> None:
    """The probe finds each folder's shard again, whatever dashes the topic's name holds (v3io shards too)."""
    for shard, start, end in (("clicks-a-1:12", 0, 5), ("t:0", 10**9, 10**9 + 1), ("3", 7, 70)):
        assert parse_range_directory(range_key(shard, start, end)) == (shard, start, end)


@pytest.mark.spark
@pytest.mark.kafka
def test_the_peer_and_our_source_read_the_same_committed_records_and_count_the_same_views(
    kafka_bootstrap: str, kafka_topics: TopicFactory, spark: SparkSession, tmp_path: Path
) -> None:
    topic = kafka_topics(PARTITIONS, prefix="peer")
    produce_clicks(kafka_bootstrap, topic, CLICKS, seed=7)
    transaction(kafka_bootstrap, topic, ABORTED_PER_PARTITION, commit=False)
    transaction(kafka_bootstrap, topic, COMMITTED_PER_PARTITION, commit=True)
    produce_clicks(kafka_bootstrap, topic, 1_000, seed=8)
    ends = high_watermarks(kafka_bootstrap, topic)
    assert set(ends) == {f"{topic}:{p}" for p in range(PARTITIONS)}

    peer_records: list[Record] = []

    def keep(batch: DataFrame, _batch_id: int) -> None:
        peer_records.extend(records_of(batch))

    query, batches = start_query(
        spark, kafka_bootstrap, topic, tmp_path / "peer", tmp_path / "checkpoint", inspect=keep
    )
    started = time.time()
    await_query(query, QUERY_TIMEOUT_S)
    peer_records.sort()
    assert checkpoint_committed(tmp_path / "checkpoint", topic, list(ends)) == ends, "the checkpoint's offsets"
    assert batches_committed_between(tmp_path / "checkpoint", started - 1, time.time() + 1) == 1

    config = KafkaStreamConfig(bootstrap_servers=kafka_bootstrap, topics=[topic])
    ours = read_kafka_ranges(spark, config, {shard: (0, end) for shard, end in ends.items()}).persist()
    try:
        ranges = [StreamRange(shard, 0, end) for shard, end in ends.items()]
        write_page_views(page_views(ours, ranges), tmp_path / "ours")
        our_records = records_of(ours)
    finally:
        ours.unpersist()

    committed = CLICKS + 1_000 + 2 * PARTITIONS + PARTITIONS * COMMITTED_PER_PARTITION
    assert len(our_records) == committed
    assert [(p, o) for p, o, _, _ in peer_records] == [(p, o) for p, o, _, _ in our_records]
    assert peer_records == our_records, "same keys and values at the same offsets"
    assert not [r for r in our_records if b"aborted-" in (r[3] or b"")], "no aborted record was read"
    gaps = sum(ends.values()) - committed
    assert gaps >= PARTITIONS * ABORTED_PER_PARTITION, "the aborted records hold offsets below the ends"
    assert batches.records == committed and len(batches.done) == 1

    per_partition = {f"{topic}:{p}": sum(1 for r in our_records if r[0] == p) for p in range(PARTITIONS)}
    assert sink_views_by_shard(tmp_path / "peer") == per_partition
    assert sink_views_by_shard(tmp_path / "ours") == per_partition
    for side in ("peer", "ours"):
        probe = probe_sink(tmp_path / side, per_partition)
        assert probe["ok"], (side, probe)


@pytest.mark.spark
@pytest.mark.kafka
def test_the_following_peer_commits_what_is_produced_while_it_runs(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path
) -> None:
    """``bench.sustained``'s peer: the query with the default trigger, in a process of its own, commits in its
    checkpoint what is produced before and while it runs, and stops when asked."""
    topic = kafka_topics(PARTITIONS, prefix="follow")
    produce_clicks(kafka_bootstrap, topic, 2_000, seed=9)
    spec = PeerSpec(bootstrap=kafka_bootstrap, topic=topic, work=str(tmp_path), driver_memory="1g")
    with following_peer(spec) as peer:
        wait_committed(peer, high_watermarks(kafka_bootstrap, topic), QUERY_TIMEOUT_S)
        produce_clicks(kafka_bootstrap, topic, 3_000, seed=10)
        ends = high_watermarks(kafka_bootstrap, topic)
        wait_committed(peer, ends, QUERY_TIMEOUT_S)
        assert peer.committed(list(ends)) == ends
    assert not peer.process.is_alive()
    assert sum(sink_views_by_shard(tmp_path / "output").values()) == 5_000 + 2 * PARTITIONS
