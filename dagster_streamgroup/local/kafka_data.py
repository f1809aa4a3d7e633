"""Topics and data for trying the project and for tests: create/delete topics, produce records fast.

Every producer here ends each partition it wrote with one single-record batch (one record more per partition
than asked for, which the tests' counts expect). The end offsets are returned from delivery reports, so callers
never depend on a broker's watermark to know what was written.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from dagster_streamgroup.streams.kafka_config import PropertyValue

BULK_PRODUCER: dict[str, PropertyValue] = {
    "linger.ms": 10,
    "batch.size": 1_000_000,
    "batch.num.messages": 100_000,
    "compression.type": "none",
    "acks": "all",
    "queue.buffering.max.messages": 1_000_000,
}
SINGLE_RECORD_BATCHES: dict[str, PropertyValue] = {"batch.num.messages": 1, "linger.ms": 0, "acks": "all"}


def _config(client: Mapping[str, PropertyValue] | str) -> dict[str, PropertyValue]:
    return {"bootstrap.servers": client} if isinstance(client, str) else dict(client)


def create_topics(
    client: Mapping[str, PropertyValue] | str,
    topics: Mapping[str, int],
    *,
    exist_ok: bool = False,
    timeout_s: float = 15.0,
) -> None:
    """Create topics ``{name: partitions}`` and wait until their metadata shows every partition."""
    admin = AdminClient(_config(client))
    futures = admin.create_topics([NewTopic(t, n, 1) for t, n in topics.items()], operation_timeout=timeout_s)
    for future in futures.values():
        try:
            future.result()
        except KafkaException as exc:
            if not (exist_ok and exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS):
                raise
    deadline = time.monotonic() + timeout_s
    while True:
        metadata = admin.list_topics(timeout=timeout_s)
        missing = [t for t, n in topics.items() if t not in metadata.topics or len(metadata.topics[t].partitions) < n]
        if not missing:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"topics {missing} did not show all partitions within {timeout_s:.0f} s")
        time.sleep(0.05)


def delete_topics(client: Mapping[str, PropertyValue] | str, topics: Iterable[str], timeout_s: float = 15.0) -> None:
    topics = list(topics)
    if not topics:
        return
    admin = AdminClient(_config(client))  # must outlive its futures
    for future in admin.delete_topics(topics, operation_timeout=timeout_s).values():
        try:
            future.result()
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise


class _Deliveries:
    """Counts failed deliveries and remembers the highest offset written per partition."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.last: dict[int, int] = {}

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.errors.append(err.str())
        else:
            offset, partition = int(msg.offset() or 0), int(msg.partition() or 0)
            if offset > self.last.get(partition, -1):
                self.last[partition] = offset

    def check(self) -> None:
        if self.errors:
            raise RuntimeError(f"{len(self.errors)} records were not delivered, e.g. {self.errors[0]}")


def produce_or_wait(producer: Producer, topic: str, value: bytes | None, **kwargs: object) -> None:
    """``producer.produce``, waiting for deliveries while librdkafka's local queue is full.

    The queue holds ``queue.buffering.max.messages`` records (100,000 by default); past that ``produce`` raises
    ``BufferError`` instead of blocking, so a loop that produces faster than the broker acknowledges must poll
    and try again rather than fail or drop the record."""
    while True:
        try:
            producer.produce(topic, value, **kwargs)  # type: ignore[arg-type]
            return
        except BufferError:
            producer.poll(0.05)


def _flush(producer: Producer, timeout_s: float) -> None:
    left = producer.flush(timeout_s)
    if left:
        raise TimeoutError(f"{left} records still undelivered after {timeout_s:.0f} s")


def produce_sample(
    client: Mapping[str, PropertyValue] | str,
    topic: str,
    partitions: int,
    count: int,
    *,
    value_size: int = 100,
    flush_timeout_s: float = 120.0,
) -> dict[int, int]:
    """Write ``count`` records (keys ``str(i)``, ``value_size``-byte values) round-robin over the partitions,
    then one trailing record per partition, and return each partition's exact end offset (exclusive)."""
    value = b"x" * value_size
    deliveries = _Deliveries()
    # Idempotent: a batch retried after a timeout under load keeps its place in the partition (record i stays at
    # offset i // partitions), where a plain producer may write a later batch first.
    producer = Producer({**BULK_PRODUCER, "enable.idempotence": True, **_config(client)})
    for i in range(count):
        produce_or_wait(producer, topic, value, key=str(i).encode(), partition=i % partitions, on_delivery=deliveries)
        if i % 10_000 == 0:
            producer.poll(0)
    _flush(producer, flush_timeout_s)
    for partition in range(partitions):
        producer.produce(topic, value, b"end", partition, on_delivery=deliveries)
    _flush(producer, flush_timeout_s)
    deliveries.check()
    return {p: deliveries.last[p] + 1 for p in range(partitions)}


def produce_records(
    client: Mapping[str, PropertyValue] | str,
    topic: str,
    partition: int,
    values: Sequence[bytes | None],
    *,
    keys: Sequence[bytes | None] | None = None,
    timestamps_ms: Sequence[int] | None = None,
    headers: Sequence[list[tuple[str, bytes | None]] | None] | None = None,
    timeout_s: float = 30.0,
) -> list[int]:
    """Write records to one partition in order, each in its own batch, and return their offsets."""
    offsets: list[int] = []
    errors: list[str] = []

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            errors.append(err.str())
        else:
            offsets.append(int(msg.offset() or 0))

    producer = Producer({**SINGLE_RECORD_BATCHES, "enable.idempotence": True, **_config(client)})
    for i, value in enumerate(values):
        produce_or_wait(
            producer,
            topic,
            value,
            key=keys[i] if keys is not None else None,
            partition=partition,
            on_delivery=on_delivery,
            timestamp=timestamps_ms[i] if timestamps_ms is not None else 0,
            headers=list(headers[i] or []) if headers is not None else None,
        )
    _flush(producer, timeout_s)
    if errors:
        raise RuntimeError(f"{len(errors)} records were not delivered, e.g. {errors[0]}")
    return sorted(offsets)
