"""Kafka topics as sinks, exactly once: a range's output records and a marker of the range in one Kafka transaction.

Kafka's read-process-write pattern, with the group state in our store instead of a Kafka consumer group: each
source shard's output is produced by a transactional producer whose ``transactional.id`` is the sink's and the
shard's (``<prefix>.<topic>:<partition>``). In one transaction it writes the records of the run's range of that
shard and commits, with ``send_offsets_to_transaction``, the range's end as the sink's own group offset of the
source partition (group ``marker_group``). So:

- a retry of a range whose output is already committed (a run killed between its sink commit and its state
  commit, or a wave retried) finds the sink's offset at or past the range's end and produces nothing; a range
  that starts before the sink's offset (a handover with other bounds) produces only the records from it on;
- a zombie is fenced: every writer of a shard's output uses the same ``transactional.id``, and
  ``init_transactions`` bumps its producer epoch, so of two runs writing the same shard only the one whose
  producer was initialised last can commit (the other's commit fails as fenced, and its run fails: its ranges
  are retried, and find the marker); the sink's offset is read after ``init_transactions``, when no other
  transaction of the shard is open;
- consumers reading with ``isolation.level=read_committed`` (the Java client's default is read_uncommitted)
  see each output record once; the records of aborted and fenced transactions are in the log, marked aborted.

The sink's group offsets are an ordinary consumer group's: ``kafka-consumer-groups --describe --group
<marker_group>`` shows how far each source partition's output reaches. Where a guarantee rests on a setting of
the user's, the setting is refused when the sink is built (``producer_properties``). A backfill of records whose
output is out produces nothing (``replaces_by_coordinates`` is false: appends cannot be replaced).
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

from pydantic import Field, field_validator, model_validator

from dagster_streamgroup.sinks.base import RangeSink, SinkResult, SinkRun, Stopwatch, backoff_s, to_arrow
from dagster_streamgroup.sinks.coordinates import (
    CoordinateColumns,
    ShardRange,
    check_columns,
    check_ranges,
    check_rows_in_ranges,
    shard_keys,
    source_kind,
)
from dagster_streamgroup.streams.kafka_config import PropertyValue, is_secret_property

if TYPE_CHECKING:
    import pyarrow as pa
    from confluent_kafka import Consumer, Producer

log = logging.getLogger(__name__)

SOURCE_HEADER = "streamgroup.source"
"""Each output record's source record, ``<topic>:<partition>:<offset>``, when ``source_header`` is on."""

_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_TIMEOUT_S = 30.0
_COORDINATOR_CODES = frozenset({14, 15, 16, 88})
"""COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR, UNSTABLE_OFFSET_COMMIT: answers of a
group coordinator that is starting, moving, or holding a transaction's offsets; the call is made again."""

_OWNED_PROPERTIES = {
    "transactional.id": "the sink sets it per source shard (<transactional_id_prefix>.<shard>), which is what "
    "fences a zombie; set transactional_id_prefix instead",
    "bootstrap.servers": "set bootstrap_servers",
    "group.id": "the sink's marker group is marker_group",
    "isolation.level": "the sink reads its marker offsets read_committed, which the guarantee needs",
}
_REQUIRED: dict[str, tuple[frozenset[str], str]] = {
    "enable.idempotence": (frozenset({"true", "1"}), "transactions need the idempotent producer"),
    "acks": (frozenset({"all", "-1"}), "a record acknowledged by the leader alone can be lost on failover"),
    "request.required.acks": (frozenset({"all", "-1"}), "a record acknowledged by the leader alone can be lost"),
}
_MAX_IN_FLIGHT = ("max.in.flight.requests.per.connection", "max.in.flight")


class KafkaSinkError(RuntimeError):
    """A Kafka sink's transaction failed (the message names the shard and the Kafka error's code)."""


class KafkaSinkFencedError(KafkaSinkError):
    """Another writer of the same shard's output initialised the shard's transactional id after this one: this
    writer's transaction is fenced (a zombie, or the writer a zombie fenced); its run fails and is retried."""


class KafkaTopicSink(RangeSink):
    """A Kafka topic that each run's output records go to, exactly once per source record."""

    kind: Literal["kafka"] = "kafka"
    replaces_by_coordinates: ClassVar[bool] = False

    topic: str = Field(description="The output topic (it must exist).")
    bootstrap_servers: str | None = Field(
        default=None,
        description="The output cluster; default: the group's own connection (its security settings included).",
    )
    producer_properties: dict[str, PropertyValue] = Field(
        default_factory=dict,
        description="librdkafka properties of the sink's producers and marker reader (no secrets; settings that "
        "would break exactly once are refused).",
    )
    value_column: str = Field(default="value", description="The column holding each output record's value.")
    key_column: str | None = Field(default="key", description="The column holding its key (none: no key).")
    coordinates: CoordinateColumns = Field(
        default_factory=CoordinateColumns, description="The columns holding each row's source record."
    )
    source_header: bool = Field(
        default=True, description=f"Give each output record a {SOURCE_HEADER} header: its source record."
    )
    marker_group: str | None = Field(
        default=None,
        description="The Kafka consumer group holding how far each source partition's output reaches "
        "(default: streamgroup.<group>.sink.<topic>).",
    )
    transactional_id_prefix: str | None = Field(
        default=None, description="Prefix of the per-shard transactional ids (default: the marker group)."
    )
    transaction_timeout_ms: int = Field(
        default=60_000,
        ge=1_000,
        description="How long a transaction left open by a killed run holds read_committed consumers of its "
        "partitions, unless the shard's next writer aborts it first (it does, when it starts).",
    )
    parallelism: int = Field(default=4, ge=1, le=64, description="Shards whose transactions run at once.")

    @field_validator("topic")
    @classmethod
    def _check_topic(cls, value: str) -> str:
        if not _TOPIC.match(value):
            raise ValueError(f"topic: {value!r} is not a Kafka topic name")
        return value

    @field_validator("producer_properties")
    @classmethod
    def _refuse_unsafe(cls, value: dict[str, PropertyValue]) -> dict[str, PropertyValue]:
        for key, setting in value.items():
            name = key.strip().lower()
            if is_secret_property(name):
                raise ValueError(
                    f"producer_properties: {key!r} holds a secret, and sink settings are shown as given: write to a "
                    "cluster the group's resource connects to (bootstrap_servers unset), whose secrets are typed"
                )
            if name in _OWNED_PROPERTIES:
                raise ValueError(f"producer_properties: {key!r} cannot be set here: {_OWNED_PROPERTIES[name]}")
            if name in _REQUIRED:
                allowed, why = _REQUIRED[name]
                if str(setting).strip().lower() not in allowed:
                    raise ValueError(
                        f"producer_properties: {key}={setting!r} breaks exactly once ({why}); leave it unset"
                    )
            if name in _MAX_IN_FLIGHT and int(setting) > 5:
                raise ValueError(
                    f"producer_properties: {key}={setting!r} breaks the idempotent producer's ordering (at most 5)"
                )
            if name == "transaction.timeout.ms":
                raise ValueError("producer_properties: 'transaction.timeout.ms' is the field transaction_timeout_ms")
        return value

    @model_validator(mode="after")
    def _check_columns(self) -> KafkaTopicSink:
        if self.key_column is not None and self.key_column == self.value_column:
            raise ValueError("key_column and value_column: must be different columns")
        return self

    def target(self) -> str:
        return f"kafka topic {self.topic}"

    def marker_group_for(self, run: SinkRun | None) -> str:
        if self.marker_group is not None:
            return self.marker_group
        if run is None:
            raise ValueError(
                f"kafka sink {self.topic}: name marker_group, or write through a stream asset (sink=...), which "
                "names it after its consumer group"
            )
        return f"streamgroup.{run.group}.sink.{self.topic}"

    def transactional_id(self, shard: str, run: SinkRun | None) -> str:
        return f"{self.transactional_id_prefix or self.marker_group_for(run)}.{shard}"

    def client_config(self, run: SinkRun | None) -> dict[str, PropertyValue]:
        """The connection (with secrets: never logged) and the user's properties."""
        if self.bootstrap_servers is not None:
            base: dict[str, PropertyValue] = {"bootstrap.servers": self.bootstrap_servers}
        elif run is not None and run.kafka_client is not None:
            base = dict(run.kafka_client())
        else:
            raise ValueError(
                f"kafka sink {self.topic}: set bootstrap_servers (the group's connection is known only to a stream "
                "asset's run over a Kafka group)"
            )
        return {**base, **self.producer_properties}

    def committed(self, shards: Sequence[str], run: SinkRun | None = None) -> dict[str, int]:
        """How far each source shard's output reaches (the sink's group offsets; shards with none left out)."""
        from confluent_kafka import Consumer

        consumer = Consumer(self._consumer_config(run))
        try:
            return {shard: offset for shard in shards if (offset := _marker(consumer, shard)) is not None}
        finally:
            consumer.close()

    def _consumer_config(self, run: SinkRun | None) -> dict[str, PropertyValue]:
        config = {k: v for k, v in self.client_config(run).items() if not _producer_only(k)}
        return {
            **config,
            "group.id": self.marker_group_for(run),
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }

    def producer_config(self, shard: str, run: SinkRun | None) -> dict[str, PropertyValue]:
        """The settings of the producer of ``shard``'s output (with secrets: never logged)."""
        return {
            **self.client_config(run),
            "transactional.id": self.transactional_id(shard, run),
            "enable.idempotence": True,
            "acks": "all",
            "transaction.timeout.ms": self.transaction_timeout_ms,
            "linger.ms": self.producer_properties.get("linger.ms", 5),
        }

    def write(self, df: Any, ranges: Sequence[ShardRange], run: SinkRun | None = None) -> SinkResult:
        clock = Stopwatch()
        check_ranges(ranges)
        live = [r for r in ranges if r.end > r.start]
        if not live:
            return SinkResult(kind=self.kind, target=self.target(), rows=0, ranges=0)
        what = f"kafka sink {self.topic}"
        if source_kind(live) != "kafka":
            raise ValueError(
                f"{what}: its marker is the sink's group offset of each source partition, so it takes Kafka "
                "sources only; write a v3io stream's output to a Delta table"
            )
        sources = {r.shard.rpartition(":")[0] for r in live}
        if self.topic in sources:
            raise ValueError(f"{what}: the output topic is one of the run's source topics (a loop)")
        data = to_arrow(df)
        check_columns(data, "kafka", self.coordinates, what)
        for column in (self.value_column, self.key_column):
            if column is not None and column not in data.column_names:
                raise ValueError(f"{what}: the rows lack the column {column!r} (have: {', '.join(data.column_names)})")
        check_rows_in_ranges(data, live, "kafka", self.coordinates, what)
        by_shard = _split_by_shard(data, self.coordinates)
        self.marker_group_for(run)  # named, or a clear error before any transaction
        with ThreadPoolExecutor(max_workers=min(self.parallelism, len(live)), thread_name_prefix="kafka-sink") as pool:
            outcomes = list(pool.map(lambda r: self._commit_shard(r, by_shard.get(r.shard), run), live))
        return SinkResult(
            kind=self.kind,
            target=self.target(),
            rows=sum(o.rows for o in outcomes),
            ranges=len(live),
            skipped_ranges=sum(1 for o in outcomes if o.skipped),
            seconds=clock.seconds,
        )

    def _commit_shard(self, r: ShardRange, rows: pa.Table | None, run: SinkRun | None) -> _ShardOutcome:
        """One shard's transaction: fence older writers, read the marker, produce what is not out yet, commit
        the records with the marker."""
        from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

        topic, _, partition_text = r.shard.rpartition(":")
        partition = int(partition_text)
        producer = Producer(self.producer_config(r.shard, run))
        consumer = Consumer(self._consumer_config(run))
        try:
            try:
                _retried(lambda: producer.init_transactions(_TIMEOUT_S))
                written = _marker(consumer, r.shard)
            except KafkaException as exc:
                raise _sink_error(exc, r, "fencing older writers and reading the marker") from exc
            if written is not None and written >= r.end:
                log.info("%s [%d, %d): output committed already (marker %d): nothing produced", r.shard, r.start,
                         r.end, written)  # fmt: skip
                return _ShardOutcome(rows=0, skipped=True)
            first = r.start if written is None or written < r.start else written
            records = _rows_from(rows, self.coordinates.offset, first)
            try:
                producer.begin_transaction()
                produced = self._produce(producer, records, r.shard)
                metadata = consumer.consumer_group_metadata()
                marker = [TopicPartition(topic, partition, r.end)]
                _retried(lambda: producer.send_offsets_to_transaction(marker, metadata, _TIMEOUT_S))
                _retried(lambda: producer.commit_transaction(_TIMEOUT_S))
            except KafkaException as exc:
                _abort_quietly(producer, exc)
                raise _sink_error(exc, r, "its transaction") from exc
            return _ShardOutcome(rows=produced, skipped=False)
        finally:
            consumer.close()  # the producer's transaction is committed or aborted (or fenced) by now

    def _produce(self, producer: Producer, records: pa.Table | None, shard: str) -> int:
        if records is None or records.num_rows == 0:
            return 0
        values = records.column(self.value_column).to_pylist()
        keys = records.column(self.key_column).to_pylist() if self.key_column else [None] * len(values)
        offsets = records.column(self.coordinates.offset).to_pylist()
        for value, key, offset in zip(values, keys, offsets, strict=True):
            headers: list[tuple[str, str | bytes | None]] | None = (
                [(SOURCE_HEADER, f"{shard}:{offset}".encode())] if self.source_header else None
            )
            while True:
                try:
                    producer.produce(self.topic, _bytes(value), _bytes(key), headers=headers)
                    break
                except BufferError:
                    producer.poll(0.1)  # the local queue is full: let deliveries drain it
            producer.poll(0)
        return len(values)


@dataclass(frozen=True)
class _ShardOutcome:
    rows: int
    skipped: bool


def _marker(consumer: Consumer, shard: str) -> int | None:
    """The sink's group offset of a source partition (none: never committed). Asked again while the group's
    coordinator loads or moves, or a transaction's offsets are still pending, as a Kafka consumer does."""
    from confluent_kafka import TopicPartition

    topic, _, partition = shard.rpartition(":")
    return _retried(
        lambda: _offset_of(consumer.committed([TopicPartition(topic, int(partition))], timeout=_TIMEOUT_S)[0])
    )


def _offset_of(found: Any) -> int | None:
    from confluent_kafka import KafkaException

    if found.error is not None:
        raise KafkaException(found.error)
    return None if found.offset < 0 else int(found.offset)


T = TypeVar("T")


def _retried(call: Callable[[], T], within_s: float = _TIMEOUT_S) -> T:
    """``call()``, again while it fails with a retriable Kafka error (a coordinator loading or moving, pending
    transactional offsets), up to ``within_s``."""
    from confluent_kafka import KafkaError, KafkaException

    deadline = time.monotonic() + within_s
    attempt = 0
    while True:
        try:
            return call()
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            retriable = isinstance(error, KafkaError) and (error.retriable() or error.code() in _COORDINATOR_CODES)
            if not retriable or time.monotonic() > deadline:
                raise
        time.sleep(backoff_s(attempt, base_s=0.1, cap_s=1.0))
        attempt += 1


def _split_by_shard(data: pa.Table, columns: CoordinateColumns) -> dict[str, pa.Table]:
    import pyarrow.compute as pc

    keys = shard_keys(data, "kafka", columns)
    return {str(shard): data.filter(pc.equal(keys, shard)) for shard in pc.unique(keys).to_pylist()}


def _rows_from(rows: pa.Table | None, offset_column: str, first: int) -> pa.Table | None:
    """The shard's rows from offset ``first`` on, in offset order (the output keeps the source's order)."""
    import pyarrow.compute as pc

    if rows is None:
        return None
    kept = rows.filter(pc.greater_equal(rows.column(offset_column), first))
    return kept.sort_by([(offset_column, "ascending")])


def _bytes(value: Any) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"a Kafka record's key and value are bytes or strings, got {type(value).__name__}")


def _producer_only(key: str) -> bool:
    """Producer properties a consumer would warn about (librdkafka logs unknown-for-role properties)."""
    return key in {"linger.ms", "acks", "enable.idempotence", "compression.type", "batch.size", "batch.num.messages",
                   "queue.buffering.max.messages", "queue.buffering.max.kbytes", "queue.buffering.max.ms",
                   "message.timeout.ms", "delivery.timeout.ms", "max.in.flight.requests.per.connection",
                   "max.in.flight", "request.required.acks", "compression.codec"}  # fmt: skip


def _abort_quietly(producer: Producer, cause: Exception) -> None:
    """Abort a transaction that failed in a way that allows it; a fenced producer cannot abort, and the shard's
    next writer's ``init_transactions`` aborts what it left open."""
    from confluent_kafka import KafkaException

    error = cause.args[0] if cause.args else None
    if error is not None and getattr(error, "txn_requires_abort", lambda: False)():
        with contextlib.suppress(KafkaException):
            producer.abort_transaction(_TIMEOUT_S)


def _sink_error(exc: Exception, r: ShardRange, doing: str) -> KafkaSinkError:
    from confluent_kafka import KafkaError

    error = exc.args[0] if exc.args else None
    code = error.code() if isinstance(error, KafkaError) else None
    name = error.name() if isinstance(error, KafkaError) else type(exc).__name__
    detail = error.str() if isinstance(error, KafkaError) else str(exc)
    text = f"{r.shard} [{r.start}, {r.end}): {doing} failed: {name}: {detail}"
    fenced = {getattr(KafkaError, n, None) for n in ("_FENCED", "PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH")}
    if code in fenced:
        return KafkaSinkFencedError(f"{text} (fenced: another writer of this shard's output started after this one)")
    return KafkaSinkError(text)
