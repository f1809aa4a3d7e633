"""The chaos run's records: keyed bulk chunks and poison records.

What counts as written is what the broker acknowledged (delivery reports), never the watermark: for each
acknowledged record, its offset and its payload's CRC-32, so the check can tell an acknowledged record that
the broker lost from a new record the broker later wrote at its offset. The producers are idempotent, as a
careful producer is: a broker restarted mid-batch makes librdkafka resend, and without idempotence a resent
batch would be written twice at new offsets.
"""

from __future__ import annotations

import random
import time
from array import array
from collections.abc import Iterable

from confluent_kafka import KafkaError, Message, Producer

from bench.chaos.check import NOT_ACKNOWLEDGED
from bench.chaos.recorder import POISON_MARKER, payload_hash
from dagster_streamgroup.local.kafka_data import BULK_PRODUCER, SINGLE_RECORD_BATCHES, produce_or_wait


class ChaosProducer:
    def __init__(self, bootstrap: str, topic: str, partitions: int, seed: int) -> None:
        self.topic = topic
        self.partitions = partitions
        self.rng = random.Random(seed)
        client = {"bootstrap.servers": bootstrap, "message.timeout.ms": 120_000, "enable.idempotence": True}
        self.bulk = Producer({**BULK_PRODUCER, **client})
        self.single = Producer({**SINGLE_RECORD_BATCHES, **client})
        self.ends: dict[int, int] = {}
        """Per partition, the highest acknowledged offset + 1."""
        self.hashes: dict[int, array[int]] = {}
        """Per partition, the payload hash acknowledged at each offset (``NOT_ACKNOWLEDGED`` where none was): 8
        bytes a record, where a dict would take about 100 for the million records of the long setting."""
        self.acknowledged = 0
        self.errors: list[str] = []
        self.poisoned: list[tuple[str, int]] = []
        """(shard, offset) of every poison record."""
        self._next = 0

    def _delivered(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.errors.append(err.str())
            return
        self.acknowledged += 1
        partition, offset = int(msg.partition() or 0), int(msg.offset() or 0)
        self.ends[partition] = max(self.ends.get(partition, 0), offset + 1)
        hashes = self.hashes.setdefault(partition, array("q"))
        if len(hashes) <= offset:
            hashes.extend([NOT_ACKNOWLEDGED] * (offset + 1 - len(hashes)))
        hashes[offset] = payload_hash(msg.value() or b"")
        if POISON_MARKER.encode() in (msg.value() or b""):
            self.poisoned.append((f"{self.topic}:{partition}", offset))

    def _value(self, i: int) -> bytes:
        return f"event {i:012d} ".encode().ljust(100, b".")

    def chunk(self, count: int, timeout_s: float = 300.0) -> None:
        """``count`` keyed records; returns once the broker acknowledged all of them."""
        for _ in range(count):
            i = self._next
            self._next += 1
            key = f"user-{self.rng.randrange(100_000)}".encode()
            produce_or_wait(self.bulk, self.topic, self._value(i), key=key, on_delivery=self._delivered)
            if i % 20_000 == 0:
                self.bulk.poll(0)
        self._flush(self.bulk, timeout_s)

    def poison(self, partitions: Iterable[int], per_partition: int, timeout_s: float = 120.0) -> None:
        """Poison records (their value carries the marker) into ``partitions``, each its own batch."""
        chosen = list(partitions)
        for _ in range(per_partition):
            self._single(chosen, POISON_MARKER, timeout_s)

    def _single(self, partitions: Iterable[int], marker: str | None, timeout_s: float) -> None:
        for partition in partitions:
            i = self._next
            self._next += 1
            value = self._value(i) if marker is None else f"{marker} {i}".encode()
            produce_or_wait(self.single, self.topic, value, partition=partition, on_delivery=self._delivered)
        self._flush(self.single, timeout_s)

    def _flush(self, producer: Producer, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while producer.flush(5.0) and time.monotonic() < deadline:
            pass  # the broker may be restarting: librdkafka retries until message.timeout.ms
        left = len(producer)
        if left:
            raise TimeoutError(f"{left} records unacknowledged after {timeout_s:.0f} s")

    def shard_ends(self) -> dict[str, int]:
        return {f"{self.topic}:{p}": end for p, end in sorted(self.ends.items())}

    def payload_hashes(self) -> dict[str, array[int]]:
        """Per shard (every partition of the topic), the payload hash acknowledged at each offset."""
        return {f"{self.topic}:{p}": self.hashes.get(p, array("q")) for p in range(self.partitions)}
