"""What only a real Apache Kafka broker shows: the group over a compacted log, partitions added while it runs,
a start at a timestamp the broker looks up, records removed by DeleteRecords and by time retention, and Kafka's
own consumer-groups tool reading the offsets the members mirror.

Each test drives real ``GroupMember`` ticks over a real ``KafkaBackend`` and a real state store, reads every
planned range with the backend's exact range reader (as a run does), commits through the member, and compares
what the group read with what the broker holds, read independently with a plain ``Consumer``.
"""

from __future__ import annotations

import subprocess
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic  # type: ignore[attr-defined]

from dagster_streamgroup import protocol
from dagster_streamgroup.local.kafka_broker import BrokerInfo, java_binary, kafka_libs
from dagster_streamgroup.local.kafka_data import produce_records, produce_sample
from dagster_streamgroup.member import GroupMember, TickReport, update_state
from dagster_streamgroup.protocol import EventKind, GroupEvent, GroupPolicy, GroupState, report_of, runs_of
from dagster_streamgroup.stores.base import StateStore
from dagster_streamgroup.stores.memory import MemoryStore
from dagster_streamgroup.stores.sql import SqlStateStore
from dagster_streamgroup.streams.base import OffsetOutOfRangeError, seconds_behind
from dagster_streamgroup.streams.kafka import KAFKA_ARROW_SCHEMA, KafkaBackend, PartitionRange, parse_shard, read_ranges
from dagster_streamgroup.streams.kafka_config import KafkaStreamConfig
from tests.fixtures.kafka import TopicFactory, unique_name

pytestmark = [pytest.mark.kafka, pytest.mark.usefixtures("_coordinator_ready")]

Record = tuple[int, bytes | None, bytes | None]
"""(offset, key, value) of one record."""


# ----------------------------------------------------------------------------------------------------------------
# helpers


@pytest.fixture(scope="module")
def _coordinator_ready(kafka_bootstrap: str) -> None:
    """Wait until the session broker's group coordinator answers. On a fresh broker the first group request
    creates ``__consumer_offsets``, and a DescribeGroups sent while it loads is answered
    COORDINATOR_LOAD_IN_PROGRESS, which ``KafkaBackend.check_group`` does not retry: a member's first tick then
    fails ("describing consumer group ...: ConsumerGroupDescribe: "). That race depends on the machine's load and
    is not what these tests are about; without this wait it could fail whichever of them came first."""
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    group = unique_name("warm-up")
    deadline = time.monotonic() + 30
    while True:
        try:
            admin.describe_consumer_groups([group], request_timeout=10)[group].result()
            return
        except KafkaException:
            assert time.monotonic() < deadline, "the group coordinator did not load within 30 s"
            time.sleep(0.2)


def _policy(**overrides: Any) -> GroupPolicy:
    """Members that claim at once and launch any backlog at once, so one tick is one step of the test."""
    fields: dict[str, Any] = {
        "heartbeat_interval_s": 1,
        "session_timeout_s": 3,
        "join_grace_s": 0,
        "min_backlog": 1,
        "max_wait_s": 0,
        "max_records_per_run": 10_000,
    }
    return GroupPolicy(**{**fields, **overrides})


def _backend(bootstrap: str, *topics: str) -> KafkaBackend:
    config = KafkaStreamConfig(bootstrap_servers=bootstrap, topics=list(topics))
    return KafkaBackend(config, request_timeout_s=10.0, stall_timeout_s=10.0)


def _member(store: StateStore, backend: KafkaBackend, group: str, member_id: str = "m0", **policy: Any) -> GroupMember:
    return GroupMember(store, backend, group, member_id, _policy(**policy), sleep=lambda _s: None)


def _sqlite(tmp_path: Path) -> SqlStateStore:
    return SqlStateStore(f"sqlite:///{tmp_path / 'state.db'}")


def _until(condition: Callable[[], bool], what: str, timeout_s: float = 30.0, poll_s: float = 0.25) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"the broker did not show {what} within {timeout_s:.0f} s"
        time.sleep(poll_s)


def _needs_local_broker(broker: BrokerInfo) -> None:
    """Compaction and time retention are shown in seconds only with the local broker's fast housekeeping."""
    if broker.pid is None:
        pytest.skip("needs the local broker's fast housekeeping (retention and cleaner checked every second)")


def _topic_with_config(topics: TopicFactory, partitions: int, config: Mapping[str, str], prefix: str) -> str:
    """A topic with per-topic settings (the fixture's factory creates defaults only), deleted with the others."""
    name = unique_name(prefix)
    admin = AdminClient({"bootstrap.servers": topics.bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1, config=dict(config))], operation_timeout=15)[name].result()
    topics.created.append(name)
    _until(lambda: len(admin.list_topics(name, timeout=10).topics[name].partitions) == partitions, f"topic {name}")
    return name


def _marks(backend: KafkaBackend) -> dict[str, tuple[int, int]]:
    return {s: (m.low, m.high) for s, m in backend.watermarks(backend.shards()).items()}


def _plain_read(bootstrap: str, topic: str, partition: int) -> list[Record]:
    """Every record the broker holds in one partition, read with a plain consumer from its beginning to its
    high watermark: the reference the group's reads are compared with."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique_name("plain"),
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )
    try:
        tp = TopicPartition(topic, partition)
        _low, high = consumer.get_watermark_offsets(tp, timeout=10, cached=False)
        consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
        out: list[Record] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                assert err.code() == KafkaError._PARTITION_EOF, err.str()
                if int(msg.offset() or 0) >= high:
                    return out
                continue
            out.append((int(msg.offset() or 0), msg.key(), msg.value()))
            if int(msg.offset() or 0) >= high - 1:
                return out
        raise AssertionError(f"{topic}:{partition}: a plain consumer did not reach the high watermark {high}")
    finally:
        consumer.close()


@dataclass(frozen=True)
class RangeRead:
    shard: str
    start: int
    end: int
    records: list[Record]


Reads = dict[str, list[Record]]


def _run(backend: KafkaBackend, member: GroupMember, launches: Sequence[protocol.Launch]) -> list[RangeRead]:
    """What each run of ``launches`` would do: read its ranges exactly with the backend's range reader, check
    every record lies in its range, in offset order, then commit the run through the member (fenced commit in
    the state, then the mirror into Kafka's group offsets)."""
    done: list[RangeRead] = []
    for ranges in runs_of(launches).values():
        parts = [PartitionRange(*parse_shard(r.shard), r.start, r.end) for r in ranges]
        batches = list(
            read_ranges(backend.config.client_config(), parts, stall_timeout_s=backend.stall_timeout_s, batch_size=97)
        )
        rows = pa.Table.from_batches(batches, schema=KAFKA_ARROW_SCHEMA).to_pylist()
        for r in ranges:
            topic, partition = parse_shard(r.shard)
            records = [
                (row["offset"], row["key"], row["value"])
                for row in rows
                if row["topic"] == topic and row["partition"] == partition
            ]
            offsets = [o for o, _k, _v in records]
            assert offsets == sorted(set(offsets)), f"{r.shard} [{r.start}, {r.end}): offsets out of order"
            assert all(r.start <= o < r.end for o in offsets), f"{r.shard}: a record outside [{r.start}, {r.end})"
            done.append(RangeRead(r.shard, r.start, r.end, records))
        assert len(rows) == sum(len(d.records) for d in done[-len(ranges) :]), "a record of no range was read"
        outcome = member.commit_run([report_of(r) for r in ranges])
        assert outcome.accepted, outcome
    return done


def _step(backend: KafkaBackend, members: Sequence[GroupMember]) -> tuple[list[TickReport], list[RangeRead]]:
    """One tick of every member, each followed by its runs (read, then commit)."""
    reports: list[TickReport] = []
    read: list[RangeRead] = []
    for member in members:
        report = member.tick()
        reports.append(report)
        read += _run(backend, member, report.inflight)
    return reports, read


def _merge(into: Reads, ranges: Sequence[RangeRead]) -> None:
    for r in ranges:
        into[r.shard] += r.records


def _drain(backend: KafkaBackend, members: Sequence[GroupMember], max_rounds: int = 8) -> tuple[Reads, list[RangeRead]]:
    """Rounds of ticks and runs until every shard's committed offset is its high watermark; what was read."""
    reads: Reads = defaultdict(list)
    ranges: list[RangeRead] = []
    for _ in range(max_rounds):
        _reports, read = _step(backend, members)
        _merge(reads, read)
        ranges += read
        state = members[0].load()
        assert state is not None
        highs = {s: high for s, (_low, high) in _marks(backend).items()}
        if all(s in state.shards and state.shards[s].committed == high for s, high in highs.items()):
            for shard, records in reads.items():
                offsets = [o for o, _k, _v in records]
                assert len(offsets) == len(set(offsets)), f"{shard}: an offset was read twice"
            return reads, ranges
    state = members[0].load()
    assert state is not None
    raise AssertionError(
        f"not drained after {max_rounds} rounds: committed "
        f"{ {s: sh.committed for s, sh in state.shards.items()} }, watermarks {_marks(backend)}"
    )


def _committed(state: GroupState | None) -> dict[str, int | None]:
    assert state is not None
    return {s: shard.committed for s, shard in state.shards.items()}


def _loss_events(events: Sequence[GroupEvent]) -> list[tuple[str | None, int | None, int | None]]:
    return [(e.shard, e.start, e.end) for e in events if e.kind == EventKind.DATA_LOSS]


def _delete_records(bootstrap: str, before: Mapping[str, int]) -> None:
    """DeleteRecords: the broker drops every record below each offset and moves the low watermark there."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    tps = [TopicPartition(*parse_shard(shard), offset) for shard, offset in before.items()]
    for tp, future in admin.delete_records(tps, operation_timeout=10, request_timeout=15).items():
        assert future.result().low_watermark == tp.offset, f"{tp.topic}:{tp.partition}"


def _skip_parked(store: StateStore, key: str, shard: str) -> None:
    """``streamgroup unpark --skip``: the operator gives the parked range up (a dead letter) and the shard goes on."""

    def transition(current: GroupState | None, now: float) -> tuple[GroupState | None, None]:
        assert current is not None
        return protocol.unpark(current, shard, now, skip=True), None

    update_state(store, key, transition)


# ----------------------------------------------------------------------------------------------------------------
# 1. compaction


COMPACTED: dict[str, str] = {
    "cleanup.policy": "compact",
    "segment.ms": "100",
    "min.cleanable.dirty.ratio": "0.01",
    "min.compaction.lag.ms": "0",
    "delete.retention.ms": "100",
}
HOT_KEYS = 7


def _write_compactable(bootstrap: str, topic: str) -> dict[bytes, int]:
    """Three waves of records, each wave its own segment (segment.ms=100 rolls at the next append): a wave of
    hot keys among unique cold keys, a stretch of 1,000 hot-key records that later waves overwrite entirely (a
    hole wider than a planned range), another mixed wave, then one record that rolls the last wave's segment
    so the cleaner may take it. Returns each key's last offset: what survives a complete compaction."""
    last: dict[bytes, int] = {}

    def on_delivery(err: KafkaError | None, msg: Any) -> None:
        assert err is None, err
        key = msg.key()
        last[key] = max(last.get(key, -1), int(msg.offset()))

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    waves = [("mixed", 500), ("hot", 1000), ("mixed", 500)]
    for wave, (kind, count) in enumerate(waves):
        for i in range(count):
            cold = kind == "mixed" and i % 10 == 5
            key = f"cold-{wave}-{i}" if cold else f"hot-{i % HOT_KEYS}"
            producer.produce(topic, f"{wave}-{i}".encode(), key.encode(), 0, on_delivery=on_delivery)
        assert producer.flush(30) == 0
        time.sleep(0.3)
    producer.produce(topic, b"tail", b"tail", 0, on_delivery=on_delivery)
    assert producer.flush(30) == 0
    return last


def test_a_compacted_topic_is_read_exactly_as_it_survives(
    kafka_broker: BrokerInfo, kafka_topics: TopicFactory, tmp_path: Path
) -> None:
    """Compaction leaves offset holes, some wider than a planned range. Ranges are planned over offsets, not
    records, so a run must end at its range end however sparse the offsets (an empty range included), read
    exactly the surviving records, and the group must commit up to the high watermark, neither waiting for
    records that were compacted away nor skipping any that survived."""
    _needs_local_broker(kafka_broker)
    bootstrap = kafka_broker.bootstrap
    topic = _topic_with_config(kafka_topics, 1, COMPACTED, "compacted")
    last = _write_compactable(bootstrap, topic)
    high = max(last.values()) + 1
    survivors = sorted(last.values())
    assert len(survivors) == 100 + HOT_KEYS + 1

    def compacted() -> bool:
        return [o for o, _k, _v in _plain_read(bootstrap, topic, 0)] == survivors

    _until(compacted, "a complete compaction (each key's last record only)")
    expected = _plain_read(bootstrap, topic, 0)
    assert expected[-1][0] == high - 1 and expected[0][0] > 0, "holes at the start and a record at the end"

    backend = _backend(bootstrap, topic)
    member = _member(_sqlite(tmp_path), backend, unique_name("g"), max_records_per_run=300)
    reads, ranges = _drain(backend, [member], max_rounds=12)

    assert reads[f"{topic}:0"] == expected
    assert len(ranges) >= high // 300, "the drain was planned in many ranges"
    assert any(r.records == [] and r.end > r.start for r in ranges), "a range wholly compacted away was run"
    assert _committed(member.load()) == {f"{topic}:0": high}
    assert backend.committed(member.group, [f"{topic}:0"]) == {f"{topic}:0": high}
    assert _plain_read(bootstrap, topic, 0) == expected, "the log changed during the test: the comparison is void"


# ----------------------------------------------------------------------------------------------------------------
# 2. partitions added while the group runs


def test_partitions_added_while_the_group_runs_are_read_from_their_first_record(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path
) -> None:
    """A partition added to a running group's topic is a shard found late: whatever the group's seek policy
    (here 'latest', which skips the records written before the group started), its records written before any
    member saw it must be read from offset 0, and the members share it. Seeking it to its end, as a new group
    would, silently loses them."""
    topic = kafka_topics(2)
    produce_sample(kafka_bootstrap, topic, 2, 100)  # before the group: skipped under seek='latest'
    backend = _backend(kafka_bootstrap, topic)
    store = _sqlite(tmp_path)
    group = unique_name("g")
    members = [_member(store, backend, group, m, seek="latest") for m in ("m0", "m1")]

    reports, read = _step(backend, members)
    assert read == [] and all(r.new_launches == [] for r in reports)
    start = {s: high for s, (_low, high) in _marks(backend).items()}
    assert _committed(members[0].load()) == start

    ends = produce_sample(kafka_bootstrap, topic, 2, 40)
    _reports, read = _step(backend, members)  # the first tick with a backlog, and its commit
    first: Reads = defaultdict(list)
    _merge(first, read)
    for p in (0, 1):
        assert [o for o, _k, _v in first[f"{topic}:{p}"]] == list(range(start[f"{topic}:{p}"], ends[p]))

    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_partitions([NewPartitions(topic, 4)])[topic].result()
    _until(lambda: len(backend.shards()) == 4, "the new partitions")
    written = {
        p: produce_records(kafka_bootstrap, topic, p, [f"new-{p}-{i}".encode() for i in range(25)]) for p in (2, 3)
    }
    assert all(offsets == list(range(25)) for offsets in written.values())

    reads, _ranges = _drain(backend, members, max_rounds=4)
    for p in (2, 3):
        shard = f"{topic}:{p}"
        assert [(o, v) for o, _k, v in reads[shard]] == [(i, f"new-{p}-{i}".encode()) for i in range(25)], shard
    state = members[0].load()
    assert state is not None
    owners = [state.shards[f"{topic}:{p}"].owner for p in range(4)]
    assert sorted(owners, key=str) == ["m0", "m0", "m1", "m1"], owners
    assert {state.shards[f"{topic}:{p}"].owner for p in (2, 3)} <= {"m0", "m1"}
    shards = [f"{topic}:{p}" for p in range(4)]
    assert backend.committed(group, shards) == {s: high for s, (_low, high) in _marks(backend).items()}


# ----------------------------------------------------------------------------------------------------------------
# 3. timestamp seek


def test_a_group_starting_at_a_timestamp_begins_where_the_broker_says(
    kafka_bootstrap: str, kafka_topics: TopicFactory
) -> None:
    """seek='timestamp' must start every partition at the broker's own offsets-for-times answer: the first
    offset whose record time is at or after the timestamp (record times, not write order, so a partition whose
    times go back and forth starts at its first recent record), and a partition whose records are all older
    starts at its end, so it reads what is written later and nothing before."""
    topic = kafka_topics(5)
    since = int(time.time() * 1000) - 600_000
    times = {
        0: [since - 5000, since - 4000, since - 3000, since - 2000, since - 1, since, since + 1, since + 2000],
        1: [since - 3000, since - 2000, since - 1],  # all older: starts at its end
        2: [since + 1, since + 2, since + 3],  # all recent: starts at 0
        3: [since - 100, since + 500, since - 50, since + 600],  # times out of order
        4: [],  # empty: starts at 0, its end
    }
    for p, stamps in times.items():
        if stamps:
            values = [f"p{p}-{i}".encode() for i in range(len(stamps))]
            produce_records(kafka_bootstrap, topic, p, values, timestamps_ms=stamps)

    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": unique_name("times")})
    try:
        answers = consumer.offsets_for_times([TopicPartition(topic, p, since) for p in times], timeout=10)
    finally:
        consumer.close()
    backend = _backend(kafka_bootstrap, topic)
    marks = _marks(backend)
    expected = {
        f"{tp.topic}:{tp.partition}": tp.offset if tp.offset >= 0 else marks[f"{tp.topic}:{tp.partition}"][1]
        for tp in answers
    }
    shard = [f"{topic}:{p}" for p in range(5)]
    assert [expected[s] for s in shard] == [5, 3, 0, 1, 0], "the broker's answers this test is built on"

    member = _member(MemoryStore(time.time), backend, unique_name("g"), seek="timestamp", seek_timestamp_ms=since)
    report = member.tick()
    assert {launch.shard: launch.start for launch in report.new_launches} == {
        s: expected[s] for s in shard if expected[s] < marks[s][1]
    }
    assert _committed(report.state) == {s: expected[s] for s in shard}
    reads: Reads = defaultdict(list)
    _merge(reads, _run(backend, member, report.inflight))
    for p in range(5):
        plain = _plain_read(kafka_bootstrap, topic, p)
        assert reads[shard[p]] == [r for r in plain if r[0] >= expected[shard[p]]], shard[p]

    produce_records(kafka_bootstrap, topic, 1, [b"p1-late"])
    produce_records(kafka_bootstrap, topic, 4, [b"p4-late"])
    later, _ranges = _drain(backend, [member], max_rounds=3)
    assert {s: [(o, v) for o, _k, v in records] for s, records in later.items() if records} == {
        shard[1]: [(3, b"p1-late")],
        shard[4]: [(0, b"p4-late")],
    }


# ----------------------------------------------------------------------------------------------------------------
# 4. retention: DeleteRecords and time


@pytest.mark.parametrize("on_data_loss", ["fail", "earliest"])
def test_records_deleted_below_and_past_the_committed_offsets(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path, on_data_loss: str
) -> None:
    """DeleteRecords below a committed offset loses nothing: no event, the shard goes on. Past it, records the
    group never read are gone: an event in the group state names the lost offsets, then, as documented
    (docs/reliability.md #26), 'fail' parks the shard at its committed offset until an operator skips the
    range, and 'earliest' goes on from the new low watermark. Never a silent reset."""
    topic = kafka_topics(2)
    below, past = f"{topic}:0", f"{topic}:1"
    ends = produce_sample(kafka_bootstrap, topic, 2, 200)
    assert ends == {0: 101, 1: 101}
    backend = _backend(kafka_bootstrap, topic)
    store = _sqlite(tmp_path)
    group = unique_name("g")
    member = _member(store, backend, group, max_records_per_run=100, on_data_loss=on_data_loss)
    _reports, read = _step(backend, [member])
    assert {(r.shard, r.start, r.end) for r in read} == {(below, 0, 50), (past, 0, 50)}

    _delete_records(kafka_bootstrap, {below: 30, past: 80})
    assert _marks(backend) == {below: (30, 101), past: (80, 101)}
    report = member.tick()

    assert _loss_events(report.new_events) == [(past, 50, 80)]
    [loss] = [e for e in report.new_events if e.kind == EventKind.DATA_LOSS]
    assert "offsets [50, 80) fell out of retention" in loss.detail and f"on_data_loss={on_data_loss}" in loss.detail
    reopened = _sqlite(tmp_path).load(member.key)[0]
    assert reopened is not None and _loss_events(reopened.events) == [(past, 50, 80)], "the event is in the store"
    launched = {launch.shard: (launch.start, launch.end) for launch in report.new_launches}
    if on_data_loss == "fail":
        assert launched == {below: (50, 101)}
        parked = report.state.shards[past].parked
        assert parked is not None and (parked.start, parked.end) == (50, 80)
        assert report.state.shards[past].committed == 50
    else:
        assert launched == {below: (50, 101), past: (80, 101)}
        assert report.state.shards[past].parked is None
    reads: Reads = defaultdict(list)
    _merge(reads, _run(backend, member, report.inflight))
    assert [o for o, _k, _v in reads[below]] == list(range(50, 101))
    if on_data_loss == "fail":
        assert reads[past] == []
        assert backend.committed(group, [past]) == {past: 50}, "the Kafka mirror keeps the parked offset"
        assert member.tick().new_launches == [], "a parked shard launches nothing"
        _skip_parked(store, member.key, past)
    rest, _ranges = _drain(backend, [member], max_rounds=3)
    assert [o for o, _k, _v in reads[past] + rest[past]] == list(range(80, 101))
    state = member.load()
    assert state is not None and _committed(state) == {below: 101, past: 101}
    assert _loss_events(state.events) == [(past, 50, 80)], "one loss, recorded once"
    if on_data_loss == "fail":
        assert [(d.shard, d.start, d.end) for d in state.dead_letters] == [(past, 50, 80)]
    assert backend.committed(group, [below, past]) == {below: 101, past: 101}


@pytest.mark.parametrize("on_data_loss", ["fail", "earliest"])
def test_records_deleted_under_a_planned_range_before_its_run_reads_it(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path, on_data_loss: str
) -> None:
    """A range in flight whose first records are deleted before the run reads them: the read fails naming the
    lost offsets (never a shorter read that would commit the whole range), the failure is reported, and the
    next tick records the loss and applies the policy."""
    topic = kafka_topics(1)
    shard = f"{topic}:0"
    produce_sample(kafka_bootstrap, topic, 1, 100)
    backend = _backend(kafka_bootstrap, topic)
    member = _member(_sqlite(tmp_path), backend, unique_name("g"), on_data_loss=on_data_loss)
    [launch] = member.tick().new_launches
    assert (launch.start, launch.end) == (0, 101)

    _delete_records(kafka_bootstrap, {shard: 40})
    with pytest.raises(OffsetOutOfRangeError, match=rf"shard {shard}: offsets \[0, 40\) are no longer") as caught:
        list(backend.read_range(shard, launch.start, launch.end))
    assert caught.value.low == 40
    member.fail_run([report_of(launch)], f"{type(caught.value).__name__}: {caught.value}")
    assert _committed(member.load()) == {shard: 0}, "a failed read commits nothing"

    report = member.tick()
    assert _loss_events(report.new_events) == [(shard, 0, 40)]
    if on_data_loss == "fail":
        assert report.new_launches == [] and report.state.shards[shard].parked is not None
        assert report.state.shards[shard].committed == 0
    else:
        [retry] = report.new_launches
        assert (retry.start, retry.end, retry.attempt) == (40, 101, 1), "the failed range, less what was lost"
        reads: Reads = defaultdict(list)
        _merge(reads, _run(backend, member, report.inflight))
        assert [o for o, _k, _v in reads[shard]] == list(range(40, 101))
        assert _committed(member.load()) == {shard: 101}


def test_a_retention_skip_moves_kafkas_group_offsets_too(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path
) -> None:
    """Under on_data_loss='earliest' the group's offset skips to the low watermark in the group state; the offset
    mirrored into Kafka's group must follow, as a Kafka consumer's auto-commit does after its offset reset.
    Otherwise, while nothing new is written, Kafka's lag tools report for good a backlog of records that no
    longer exist (an alert on consumer lag never clears), and a group whose state is lost resumes below
    retention and records the same loss a second time."""
    topic = kafka_topics(1)
    shard = f"{topic}:0"
    produce_sample(kafka_bootstrap, topic, 1, 100)
    backend = _backend(kafka_bootstrap, topic)
    group = unique_name("g")
    member = _member(_sqlite(tmp_path), backend, group, max_records_per_run=50, on_data_loss="earliest")
    _reports, read = _step(backend, [member])
    assert [(r.start, r.end) for r in read] == [(0, 50)]
    assert backend.committed(group, [shard]) == {shard: 50}

    _delete_records(kafka_bootstrap, {shard: 101})  # everything, as time retention does on a quiet topic
    report = member.tick()
    assert _loss_events(report.new_events) == [(shard, 50, 101)]
    assert report.new_launches == [] and report.state.shards[shard].committed == 101
    assert member.tick().new_launches == []
    assert backend.committed(group, [shard]) == {shard: 101}, "Kafka's group offset still shows the lost range"


TIME_RETAINED: dict[str, str] = {"retention.ms": "1000", "segment.ms": "100"}


@pytest.mark.parametrize("on_data_loss", ["fail", "earliest"])
def test_records_expired_by_time_retention_while_the_group_is_stopped(
    kafka_broker: BrokerInfo, kafka_topics: TopicFactory, tmp_path: Path, on_data_loss: str
) -> None:
    """The broker's own time retention deletes what a stopped group had not read yet (retention.ms=1000): on
    restart the members must see the loss from the low watermark, record it, and apply the policy, rather than
    fail every read or quietly start from whatever is left."""
    _needs_local_broker(kafka_broker)
    bootstrap = kafka_broker.bootstrap
    topic = _topic_with_config(kafka_topics, 1, TIME_RETAINED, "expiring")
    shard = f"{topic}:0"
    # Retention counts from the record time: records stamped 6 s ahead expire about 7 s from now, which leaves the
    # first run time to read its range on a loaded machine (stamped now, segments expire while being written).
    expiring = int(time.time() * 1000) + 6000
    assert produce_records(bootstrap, topic, 0, [b"old"] * 100, timestamps_ms=[expiring] * 100) == list(range(100))
    group = unique_name("g")
    first = _backend(bootstrap, topic)
    member = _member(_sqlite(tmp_path), first, group, max_records_per_run=60)
    _reports, [done] = _step(first, [member])
    assert (done.start, done.end, len(done.records)) == (0, 60, 60)
    del member, first  # the group stops

    probe = _backend(bootstrap, topic)
    _until(lambda: _marks(probe)[shard] == (100, 100), "every record expired by time retention")
    backend = _backend(bootstrap, topic)
    restarted = _member(_sqlite(tmp_path), backend, group, on_data_loss=on_data_loss)
    report = restarted.tick()
    assert _loss_events(report.new_events) == [(shard, 60, 100)]
    assert report.new_launches == []
    if on_data_loss == "fail":
        assert report.state.shards[shard].parked is not None and report.state.shards[shard].committed == 60
    else:
        assert report.state.shards[shard].parked is None and report.state.shards[shard].committed == 100

    future = int(time.time() * 1000) + 120_000  # newer records, kept by retention for the rest of the test
    produce_records(bootstrap, topic, 0, [b"new"] * 5, timestamps_ms=[future] * 5)
    _reports, read = _step(backend, [restarted])
    if on_data_loss == "fail":
        assert read == [], "a parked shard reads nothing, however much is written after the loss"
    else:
        assert [(r.start, r.end, [o for o, _k, _v in r.records]) for r in read] == [(100, 105, list(range(100, 105)))]
    state = restarted.load()
    assert state is not None and _loss_events(state.events) == [(shard, 60, 100)]


# ----------------------------------------------------------------------------------------------------------------
# 5. Kafka's own consumer-groups tool


def _describe_group(bootstrap: str, group: str) -> dict[tuple[str, int], dict[str, str]]:
    """``kafka-consumer-groups.sh --describe``, run from the fetched jars: one row per partition, by column."""
    command = [
        java_binary(), "-Xmx128m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-cp", f"{kafka_libs()}/*",
        "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
        "--bootstrap-server", bootstrap, "--describe", "--group", group,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 0, f"consumer-groups tool failed ({done.returncode}): {done.stderr[-2000:]}"
    lines = done.stdout.splitlines()
    headers = [i for i, line in enumerate(lines) if line.split()[:3] == ["GROUP", "TOPIC", "PARTITION"]]
    assert len(headers) == 1, f"no offsets table in the tool's output:\n{done.stdout}"
    at = headers[0]
    header = lines[at].split()
    rows: dict[tuple[str, int], dict[str, str]] = {}
    for line in lines[at + 1 :]:
        if not line.strip():
            break
        row = dict(zip(header, line.split(), strict=True))
        assert row["GROUP"] == group
        rows[(row["TOPIC"], int(row["PARTITION"]))] = row
    return rows


def test_kafkas_consumer_groups_tool_sees_the_groups_offsets_and_lag(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path
) -> None:
    """The offsets the members mirror into Kafka's group are what the ecosystem's lag tools show: per
    partition, CURRENT-OFFSET is the group state's committed offset and LAG the backlog behind the high
    watermark, mid-way through a backlog and after the drain (lag 0)."""
    topic = kafka_topics(3)
    ends = produce_sample(kafka_bootstrap, topic, 3, 600)
    backend = _backend(kafka_bootstrap, topic)
    group = unique_name("g")
    member = _member(_sqlite(tmp_path), backend, group, max_records_per_run=240)

    def check(expect_lag_zero: bool) -> None:
        state = member.load()
        assert state is not None
        marks = _marks(backend)
        rows = _describe_group(kafka_bootstrap, group)
        assert set(rows) == {(topic, p) for p in range(3)}
        for p in range(3):
            row, shard = rows[(topic, p)], state.shards[f"{topic}:{p}"]
            assert shard.committed is not None
            high = marks[f"{topic}:{p}"][1]
            assert int(row["CURRENT-OFFSET"]) == shard.committed, row
            assert int(row["LOG-END-OFFSET"]) == high == ends[p], row
            assert int(row["LAG"]) == high - shard.committed, row
            assert (int(row["LAG"]) == 0) == expect_lag_zero, row

    _reports, read = _step(backend, [member])
    assert sorted((r.start, r.end) for r in read) == [(0, 80)] * 3
    check(expect_lag_zero=False)
    _drain(backend, [member], max_rounds=4)
    check(expect_lag_zero=True)


def test_a_stopped_group_reads_as_stale_to_kafkas_tool_and_to_ours(
    kafka_bootstrap: str, kafka_topics: TopicFactory, tmp_path: Path
) -> None:
    """A group whose members all stopped is behind, and more so as records arrive and time passes: the lag
    Kafka's consumer-groups tool shows and ours agree and grow, and our seconds behind is the time since the
    first record not committed (by that record's own timestamp, exactly), growing with the wall clock, while a
    caught-up partition stays at 0."""
    topic = kafka_topics(2)
    produce_records(kafka_bootstrap, topic, 0, [b"v"] * 4)
    produce_records(kafka_bootstrap, topic, 1, [b"v"])
    backend = _backend(kafka_bootstrap, topic)
    group = unique_name("g")
    member = _member(_sqlite(tmp_path), backend, group)
    _drain(backend, [member], max_rounds=4)  # then every member stops, and p0 gets records stamped in the past
    stamps = [int(time.time() * 1000) - 120_000 + 1000 * i for i in range(6)]
    produce_records(kafka_bootstrap, topic, 0, [b"v"] * 6, timestamps_ms=stamps)
    committed = _committed(member.load())
    assert committed == {f"{topic}:0": 4, f"{topic}:1": 1}

    def both_views() -> tuple[dict[str, int], dict[str, int], dict[str, float]]:
        marks = backend.watermarks(backend.shards())
        ours = {s: marks[s].written_end - c for s, c in committed.items() if c is not None}
        theirs = {f"{t}:{p}": int(row["LAG"]) for (t, p), row in _describe_group(kafka_bootstrap, group).items()}
        return ours, theirs, seconds_behind(backend, committed, marks)

    lag1, tool1, behind1 = both_views()
    assert lag1 == tool1 == {f"{topic}:0": 6, f"{topic}:1": 0}
    now_ms = int(time.time() * 1000)
    exact = seconds_behind(backend, committed, backend.watermarks(backend.shards()), now_ms=now_ms)
    assert exact == {f"{topic}:0": (now_ms - stamps[0]) / 1000, f"{topic}:1": 0.0}
    assert behind1[f"{topic}:1"] == 0.0

    time.sleep(1.5)  # nobody commits: time passes and records arrive on both partitions
    produce_records(kafka_bootstrap, topic, 0, [b"w"] * 3)
    produce_records(kafka_bootstrap, topic, 1, [b"w"] * 2)
    lag2, tool2, behind2 = both_views()
    assert lag2 == tool2 == {f"{topic}:0": 9, f"{topic}:1": 2}
    assert behind2[f"{topic}:0"] >= behind1[f"{topic}:0"] + 1.5
    assert behind2[f"{topic}:1"] > 0.0  # now behind by its new records' age, however young
    assert backend.record_times({}) == {}
    # the kept reader is positioned afresh at every call: a later offset, then an earlier one again
    assert backend.record_times({f"{topic}:0": 7}) == {f"{topic}:0": stamps[3]}
    again = backend.record_times({f"{topic}:0": 4, f"{topic}:1": 1})
    assert again[f"{topic}:0"] == stamps[0] and again[f"{topic}:1"] is not None  # p1's new records are there
