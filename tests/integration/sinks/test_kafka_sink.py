"""The Kafka topic sink against the real broker: exactly once through a transaction per source shard.

A retry of a range whose output is committed produces nothing; a range run again with other bounds produces only
what is not out yet; a zombie's open transaction is fenced when the shard's next writer starts, and a writer a
zombie fenced fails (its run is retried and finds the marker). Consumers reading ``read_committed`` see each
output record once; the same topic read ``read_uncommitted`` holds the fenced records too, which is what the
transactions are for (the control that shows the count can fail).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from dagster_streamgroup.sinks import SOURCE_HEADER, KafkaSinkFencedError, KafkaTopicSink, SinkRun
from tests.fixtures.kafka import TopicFactory, unique_name

pytestmark = pytest.mark.kafka


@dataclass(frozen=True)
class Range:
    shard: str
    start: int
    end: int


def rows(shard: str, start: int, end: int, tag: str = "") -> pa.Table:
    topic, _, partition = shard.rpartition(":")
    n = end - start
    return pa.table(
        {
            "topic": pa.array([topic] * n, pa.string()),
            "partition": pa.array([int(partition)] * n, pa.int32()),
            "offset": pa.array(range(start, end), pa.int64()),
            "key": [f"k{o}".encode() for o in range(start, end)],
            "value": [f"{tag}{o}".encode() for o in range(start, end)],
        }
    )


def read_all(bootstrap: str, topic: str, partitions: int, isolation: str = "read_committed") -> list[tuple[str, bytes]]:
    """Every record of the output topic, as ``(source header, value)``."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique_name("reader"),
            "isolation.level": isolation,
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: list[tuple[str, bytes]] = []
    ended: set[int] = set()
    try:
        while len(ended) < partitions:
            message = consumer.poll(10)
            assert message is not None, "the output topic did not reach its end"
            if message.error() is not None:
                assert message.error().code() == -191, message.error()  # _PARTITION_EOF
                ended.add(message.partition())
                continue
            headers = dict(message.headers() or [])
            out.append((headers[SOURCE_HEADER].decode(), message.value()))
    finally:
        consumer.close()
    return out


@pytest.fixture
def topics(kafka_topics: TopicFactory) -> tuple[str, str]:
    return kafka_topics(partitions=2, prefix="src"), kafka_topics(partitions=3, prefix="out")


def test_a_retry_of_a_committed_range_produces_nothing_and_other_bounds_produce_only_the_rest(
    kafka_bootstrap: str, topics: tuple[str, str]
) -> None:
    source, output = topics
    sink = KafkaTopicSink(topic=output, bootstrap_servers=kafka_bootstrap)
    run = SinkRun(group=unique_name("g"), member="m1", run_key="r1")
    first = [Range(f"{source}:0", 0, 40), Range(f"{source}:1", 0, 25)]
    data = pa.concat_tables([rows(r.shard, r.start, r.end) for r in first])
    assert sink.write(data, first, run).rows == 65
    retry = sink.write(data, first, run)  # a run killed after its sink commit, run again
    assert (retry.rows, retry.skipped_ranges) == (0, 2)
    handover = sink.write(rows(f"{source}:0", 20, 60), [Range(f"{source}:0", 20, 60)], run)
    assert (handover.rows, handover.skipped_ranges) == (20, 0), "records 40..59 only"
    assert sink.committed([f"{source}:0", f"{source}:1", f"{source}:9"], run) == {f"{source}:0": 60, f"{source}:1": 25}
    got = Counter(h for h, _ in read_all(kafka_bootstrap, output, 3))
    assert set(got.values()) == {1} and len(got) == 85
    assert sink.marker_group_for(run) == f"streamgroup.{run.group}.sink.{output}"


class ZombieFencedMidway(KafkaTopicSink):
    """A writer that, halfway through its records, has a zombie of the same shard start (its ``init_transactions``
    lands between this writer's and its commit). The timing is arranged; fencing is the broker's."""

    def _produce(self, producer: Producer, records: pa.Table | None, shard: str) -> int:
        produced = super()._produce(producer, records, shard)
        zombie = Producer(self.producer_config(shard, self.__dict__["run"]))
        zombie.init_transactions(30)
        self.__dict__["zombie"] = zombie
        return produced


def test_a_zombies_open_transaction_is_fenced_and_read_committed_consumers_see_each_record_once(
    kafka_bootstrap: str, topics: tuple[str, str]
) -> None:
    source, output = topics
    shard = f"{source}:0"
    sink = KafkaTopicSink(topic=output, bootstrap_servers=kafka_bootstrap)
    run = SinkRun(group=unique_name("g"), member="m2", run_key="r2")
    # The zombie: an old run of the shard, its transaction open with part of the range's output.
    zombie = Producer(sink.producer_config(shard, run))
    zombie.init_transactions(30)
    zombie.begin_transaction()
    for offset in range(0, 10):
        zombie.produce(output, f"zombie{offset}".encode(), headers=[(SOURCE_HEADER, f"{shard}:{offset}".encode())])
    zombie.flush(30)
    # The shard's new owner writes the range: its start fences the zombie and aborts its open transaction.
    assert sink.write(rows(shard, 0, 30), [Range(shard, 0, 30)], run).rows == 30
    with pytest.raises(KafkaException) as fenced:
        zombie.commit_transaction(30)
    assert fenced.value.args[0].fatal(), fenced.value
    committed = read_all(kafka_bootstrap, output, 3)
    assert Counter(h for h, _ in committed) == Counter(f"{shard}:{o}" for o in range(30))
    assert not [v for _, v in committed if v.startswith(b"zombie")]
    # The control: read_uncommitted sees the aborted zombie records as well.
    uncommitted = read_all(kafka_bootstrap, output, 3, isolation="read_uncommitted")
    assert len(uncommitted) == 40 and sum(1 for _, v in uncommitted if v.startswith(b"zombie")) == 10


def test_a_writer_a_zombie_fenced_fails_and_its_retry_produces_only_what_is_not_out(
    kafka_bootstrap: str, topics: tuple[str, str]
) -> None:
    source, output = topics
    shard = f"{source}:1"
    run = SinkRun(group=unique_name("g"), member="m3", run_key="r3")
    raced = ZombieFencedMidway(topic=output, bootstrap_servers=kafka_bootstrap)
    raced.__dict__["run"] = run
    with pytest.raises(KafkaSinkFencedError, match="fenced"):
        raced.write(rows(shard, 0, 30, "first"), [Range(shard, 0, 30)], run)
    zombie: Producer = raced.__dict__["zombie"]
    # The zombie (an old run of [0, 20)) commits its output and marker, as its run would.
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": raced.marker_group_for(run)})
    zombie.begin_transaction()
    for offset in range(0, 20):
        zombie.produce(output, f"old{offset}".encode(), headers=[(SOURCE_HEADER, f"{shard}:{offset}".encode())])
    zombie.send_offsets_to_transaction([TopicPartition(source, 1, 20)], consumer.consumer_group_metadata(), 30)
    zombie.commit_transaction(30)
    consumer.close()
    # The fenced writer's range runs again: only [20, 30) is produced.
    retry = KafkaTopicSink(topic=output, bootstrap_servers=kafka_bootstrap).write(
        rows(shard, 0, 30, "second"), [Range(shard, 0, 30)], run
    )
    assert retry.rows == 10
    got = read_all(kafka_bootstrap, output, 3)
    assert Counter(h for h, _ in got) == Counter(f"{shard}:{o}" for o in range(30)), "each record once"
    assert not [v for _, v in got if v.startswith(b"first")], "the fenced writer's records are aborted"


@pytest.mark.parametrize(
    ("properties", "message"),
    [
        ({"enable.idempotence": False}, "breaks exactly once"),
        ({"acks": "1"}, "breaks exactly once"),
        ({"request.required.acks": 0}, "breaks exactly once"),
        ({"transactional.id": "mine"}, "per source shard"),
        ({"max.in.flight.requests.per.connection": 10}, "at most 5"),
        ({"isolation.level": "read_uncommitted"}, "read_committed"),
        ({"sasl.password": "hunter2"}, "holds a secret"),
        ({"transaction.timeout.ms": 900000}, "transaction_timeout_ms"),
        ({"group.id": "g"}, "marker_group"),
    ],
)
def test_settings_that_would_break_exactly_once_are_refused_when_the_sink_is_built(
    properties: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message) as refused:
        KafkaTopicSink(topic="out", bootstrap_servers="127.0.0.1:9092", producer_properties=properties)
    assert "hunter2" not in str(refused.value)


def test_a_sink_refuses_its_own_source_topic_v3io_sources_and_rows_without_values(
    kafka_bootstrap: str, topics: tuple[str, str]
) -> None:
    source, output = topics
    run = SinkRun(group="g")
    with pytest.raises(ValueError, match="a loop"):
        KafkaTopicSink(topic=source, bootstrap_servers=kafka_bootstrap).write(
            rows(f"{source}:0", 0, 3), [Range(f"{source}:0", 0, 3)], run
        )
    with pytest.raises(ValueError, match="Kafka sources only"):
        KafkaTopicSink(topic=output, bootstrap_servers=kafka_bootstrap).write(pa.table({}), [Range("3", 0, 3)], run)
    with pytest.raises(ValueError, match="lack the column 'value'"):
        KafkaTopicSink(topic=output, bootstrap_servers=kafka_bootstrap).write(
            rows(f"{source}:0", 0, 3).drop(["value"]), [Range(f"{source}:0", 0, 3)], run
        )
    with pytest.raises(ValueError, match="name marker_group"):
        KafkaTopicSink(topic=output, bootstrap_servers=kafka_bootstrap).write(
            rows(f"{source}:0", 0, 3), [Range(f"{source}:0", 0, 3)]
        )
