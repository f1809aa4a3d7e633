"""Transactional topics on Apache Kafka: committed and aborted transactions, and one left open while the group runs.

Under ``read_committed`` (the default) the runs read exactly the committed records; aborted records and the
transaction markers leave offset gaps that ranges and commits step over; a range never ends past the last
stable offset, so an open transaction holds its partition there without an incomplete range or a stall, and
the group moves on by itself once the transaction ends. The held partition is shown: its lag counts the open
transaction's records, and the status rows say what it waits on. Under ``read_uncommitted`` the same data
gives what a user who asked for it gets: the aborted records and the open transaction's records too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pyarrow as pa
import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from dagster_streamgroup.dagster.operator import shard_rows
from dagster_streamgroup.member import GroupMember
from dagster_streamgroup.protocol import EventKind, report_of
from dagster_streamgroup.stores.memory import MemoryStore
from tests.fixtures.kafka import TopicFactory, unique_name
from tests.reliability.conftest import kafka_backend, member_of

pytestmark = pytest.mark.kafka


@dataclass
class Transactions:
    """One transactional producer writing numbered values to partition 0, as ``committed`` / ``aborted`` /
    ``open`` transactions of ``size`` records each."""

    bootstrap: str
    topic: str
    producer: Producer = field(init=False)
    committed_values: list[bytes] = field(default_factory=list)
    aborted_values: list[bytes] = field(default_factory=list)
    open_values: list[bytes] = field(default_factory=list)
    _n: int = 0

    def __post_init__(self) -> None:
        self.producer = Producer(
            {"bootstrap.servers": self.bootstrap, "transactional.id": unique_name("tx"), "linger.ms": 0}
        )
        self.producer.init_transactions(30)

    def _write(self, size: int) -> list[bytes]:
        self.producer.begin_transaction()
        values = []
        for _ in range(size):
            value = f"v{self._n:04d}".encode()
            self._n += 1
            self.producer.produce(self.topic, value, partition=0)
            values.append(value)
        self.producer.flush(30)
        return values

    def commit(self, size: int) -> None:
        values = self._write(size)
        self.producer.commit_transaction(30)
        self.committed_values += values

    def abort(self, size: int) -> None:
        values = self._write(size)
        self.producer.abort_transaction(30)
        self.aborted_values += values

    def begin_open(self, size: int) -> None:
        self.open_values = self._write(size)

    def commit_open(self) -> None:
        """Commit the open transaction, and return once the partition's last stable offset has passed it: the
        broker answers the commit once it is logged and writes the partition's commit marker just after, so a
        tick at once may still find the partition held (it then launches at its next tick, which a test that
        drains at once does not wait for)."""
        self.producer.commit_transaction(30)
        self.committed_values += self.open_values
        self.open_values = []
        shard = f"{self.topic}:0"
        backend = kafka_backend(self.bootstrap, self.topic)
        deadline = time.monotonic() + 30
        while backend.watermarks([shard])[shard].held_by_open_transaction:
            assert time.monotonic() < deadline, "the committed transaction still holds its partition after 30 s"
            time.sleep(0.1)


def drain(member: GroupMember, ticks: int = 10) -> list[bytes]:
    """Tick, read every launched range exactly as a run does, commit it; until a tick launches nothing."""
    read: list[bytes] = []
    for _ in range(ticks):
        launches = member.tick().new_launches
        if not launches:
            return read
        for launch in launches:
            started = time.monotonic()
            batches = list(member.backend.read_range(launch.shard, launch.start, launch.end))
            assert time.monotonic() - started < 10, "a range ending before the last stable offset waits for nothing"
            table = pa.Table.from_batches(batches, member.backend.arrow_schema)
            read += table.column("value").to_pylist()
            assert member.commit(report_of(launch)).committed == launch.end
    raise AssertionError(f"the group still launched ranges after {ticks} ticks")


def test_read_committed_reads_committed_records_and_an_open_transaction_holds_its_partition(
    kafka_bootstrap: str, kafka_topics: TopicFactory
) -> None:
    topic = kafka_topics(1)
    shard = f"{topic}:0"
    tx = Transactions(kafka_bootstrap, topic)
    tx.commit(5)
    tx.abort(4)
    tx.commit(3)
    tx.begin_open(6)  # left open while the group runs
    backend = kafka_backend(kafka_bootstrap, topic)
    member = member_of(MemoryStore(time.time), backend, unique_name("g"))

    assert drain(member) == tx.committed_values, "aborted records and the open transaction's records stay unread"
    state = member.load()
    assert state is not None
    mark = backend.watermarks([shard])[shard]
    held_at = state.shards[shard].committed
    assert held_at == mark.high, "the committed offset stops at the last stable offset"
    assert held_at > 8 + 2, "the aborted records and the markers took offsets the group stepped over"
    assert mark.held_by_open_transaction and mark.uncommitted_high == held_at + 6
    report = member.tick()
    assert report.new_launches == [], "nothing past the last stable offset is launched"
    assert report.lag == {shard: 6}, "the lag counts the open transaction's records"
    [row] = shard_rows(state, {shard: mark})
    assert row.lag == 6 and "waits on an open transaction" in row.waits and str(held_at) in row.waits

    opened = list(tx.open_values)
    tx.commit_open()  # the group moves on by itself
    assert drain(member) == opened
    state = member.load()
    assert state is not None
    final = backend.watermarks([shard])[shard]
    assert not final.held_by_open_transaction
    assert state.shards[shard].committed == final.high, "the commit steps over the last marker to the end"


def test_the_group_reads_an_open_transactions_records_once_it_commits(
    kafka_bootstrap: str, kafka_topics: TopicFactory
) -> None:
    topic = kafka_topics(1)
    tx = Transactions(kafka_bootstrap, topic)
    tx.commit(2)
    tx.begin_open(3)
    member = member_of(MemoryStore(time.time), kafka_backend(kafka_bootstrap, topic), unique_name("g"))
    first = drain(member)
    held = list(tx.open_values)
    tx.commit_open()
    assert first + drain(member) == tx.committed_values
    assert set(held) <= set(tx.committed_values)


@pytest.mark.parametrize("level", ["read_uncommitted", "READ_UNCOMMITTED"])
def test_read_uncommitted_reads_aborted_and_open_records_too(
    kafka_bootstrap: str, kafka_topics: TopicFactory, level: str
) -> None:
    """What a user who sets ``isolation.level=read_uncommitted`` gets: every record written, aborted or not
    committed yet, and no partition held by an open transaction. librdkafka takes the value in any case, so the
    planning does too (in upper case it used to plan to the last stable offset while the readers read past it)."""
    topic = kafka_topics(1)
    tx = Transactions(kafka_bootstrap, topic)
    tx.commit(3)
    tx.abort(2)
    tx.begin_open(4)
    backend = kafka_backend(kafka_bootstrap, topic, **{"isolation.level": level})
    member = member_of(MemoryStore(time.time), backend, unique_name("g"))
    assert sorted(drain(member)) == sorted(tx.committed_values + tx.aborted_values + tx.open_values)
    mark = backend.watermarks([f"{topic}:0"])[f"{topic}:0"]
    assert mark.uncommitted_high is None and not mark.held_by_open_transaction
    tx.producer.abort_transaction(30)


def test_records_deleted_past_an_open_transaction_are_skipped_with_an_event_and_never_park_the_shard(
    kafka_bootstrap: str, kafka_topics: TopicFactory
) -> None:
    """DeleteRecords inside an open transaction moves the low watermark past the last stable offset. The records
    below it are lost (a ``data_loss`` event, skipped under ``on_data_loss="earliest"``); the offset the group moves
    to was written and waits on the transaction, so the shard waits too, and reads on once it commits. It used to
    be parked as ``offsets_ahead`` after a session timeout, and to stay parked after the commit."""
    topic = kafka_topics(1)
    shard = f"{topic}:0"
    tx = Transactions(kafka_bootstrap, topic)
    tx.commit(5)
    tx.begin_open(6)
    backend = kafka_backend(kafka_bootstrap, topic)
    member = member_of(MemoryStore(time.time), backend, unique_name("g"), on_data_loss="earliest")
    assert drain(member) == tx.committed_values
    stable = backend.watermarks([shard])[shard].high
    cut = stable + 3  # inside the open transaction, below the high watermark
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for future in admin.delete_records([TopicPartition(topic, 0, cut)], operation_timeout=10).values():
        assert future.result().low_watermark == cut
    mark = backend.watermarks([shard])[shard]
    assert mark.low == cut > mark.high, "the low watermark passed the last stable offset"
    report = member.tick()
    [loss] = [e for e in report.new_events if e.kind == EventKind.DATA_LOSS]
    assert (loss.start, loss.end) == (stable, cut)
    deadline = time.monotonic() + 2 * member.policy.session_timeout_s
    while time.monotonic() < deadline:
        report = member.tick()
        assert report.new_launches == [] and report.state.shards[shard].parked is None, report.new_events
        time.sleep(member.policy.heartbeat_interval_s)
    left = tx.open_values[3:]
    tx.commit_open()
    assert drain(member) == left, "once the transaction commits, the shard reads on from where the loss left it"
