"""Spark's Kafka source options beside ours (docs/kafka.md, "Spark Structured Streaming's Kafka source options,
and ours"), each run on both sides over the same records to the end, on the real local broker and a real Spark
session, comparing the set of ``(partition, offset)`` each side read.

The peer is a Structured Streaming query over Spark's own Kafka source (``spark-sql-kafka-0-10``) with the
option under test, built from ``bench.peer_spark_streaming.kafka_options`` (committed records, headers, from
``earliest``) and a plain ``foreachBatch`` that keeps every batch's rows, its task count and when it ran.
Our side is the group protocol driven directly, without Dagster: ``GroupMember`` ticks over a ``KafkaBackend``
and a memory store with the policy field under test, each launched run's ranges read with
``backend.read_range`` (or through our Spark source where the split is what is compared) and committed.

Where the two differ, the test says so in its assertions (and docs/kafka.md's table in words):

- ``minPartitions`` / ``maxRecordsPerPartition``: the same records; under ``minPartitions`` the task counts
  differ (Spark keeps a range whose share rounds to one task whole and splits the rest over the tasks left, ours
  rounds every range's share).
- ``maxOffsetsPerTrigger``: one cap per micro-batch for the whole query; ``max_records_per_run`` caps each
  member's run, so two members read more than the cap at once.
- ``minOffsetsPerTrigger`` + ``maxTriggerDelay``: Spark counts the delay from its previous trigger (a new query
  has none, so its first trigger reads a small backlog at once; an idle query restarts the delay at every trigger
  past it, so new records wait anything up to it); ours from the first tick that saw the backlog.
- ``startingOffsets``: Spark's applies to a query without a checkpoint, ours to a shard the group never
  committed (a group whose state is lost resumes at its Kafka group offsets; a new checkpoint starts over).
- ``startingOffsetsByTimestamp`` / ``startingTimestamp``: the broker's offsets-for-times on both sides; a
  partition with no record that recent fails Spark's query unless ``startingOffsetsByTimestampStrategy=latest``
  (ours starts it at its end); a partition added later is read from its first offset on both sides.
- ``failOnDataLoss``: Spark fails the whole query, ours parks the one shard and the others go on;
  ``failOnDataLoss=false`` and ``on_data_loss="earliest"`` read the same records.
- ``includeHeaders``: the same headers (null where a record has none).
- ``kafka.isolation.level``: the same records under each level; Spark's default reads aborted records.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions  # type: ignore[attr-defined]
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from bench.peer_spark_streaming import AVAILABLE_NOW, DEFAULT_TRIGGER, await_query, kafka_options
from dagster_streamgroup.local.kafka_data import produce_records
from dagster_streamgroup.member import GroupMember, TickReport
from dagster_streamgroup.protocol import EventKind, Launch, report_of, runs_of
from dagster_streamgroup.spark.kafka_read import read_kafka_ranges_by
from dagster_streamgroup.spark.kafka_source import read_kafka_ranges
from dagster_streamgroup.spark.session import local_spark_session
from dagster_streamgroup.stores.base import StateStore
from dagster_streamgroup.stores.memory import MemoryStore
from dagster_streamgroup.streams.kafka import KafkaBackend
from tests.fixtures.kafka import TopicFactory, unique_name
from tests.reliability.conftest import kafka_backend, member_of

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

QUERY_TIMEOUT_S = 90.0
"""What one AvailableNow query of a few hundred records may take (session warm-up included, machine loaded)."""

Headers = tuple[tuple[str, bytes | None], ...] | None
Rec = tuple[int, int, bytes | None, bytes | None, Headers]
"""``(partition, offset, key, value, headers)``."""


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


# ------------------------------------------------------------------------------------------------------------------
# records


def produce(
    bootstrap: str,
    topic: str,
    counts: Mapping[int, int],
    tag: str,
    *,
    timestamps_ms: Mapping[int, Sequence[int]] | None = None,
) -> set[tuple[int, int]]:
    """``counts[p]`` records on partition ``p`` (values ``<tag>-<p>-<i>``, keys ``k<i>``), optionally with the
    given record times; returns their ``(partition, offset)``."""
    written: set[tuple[int, int]] = set()
    for partition, n in counts.items():
        offsets = produce_records(
            bootstrap,
            topic,
            partition,
            [f"{tag}-{partition}-{i}".encode() for i in range(n)],
            keys=[f"k{i}".encode() for i in range(n)],
            timestamps_ms=timestamps_ms[partition] if timestamps_ms is not None else None,
        )
        written |= {(partition, o) for o in offsets}
    return written


def transaction(bootstrap: str, topic: str, per_partition: Mapping[int, int], *, commit: bool) -> None:
    """One transaction over the partitions, committed or aborted (values ``committed-...`` / ``aborted-...``)."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": unique_name("peer-tx"), "linger.ms": 5})
    producer.init_transactions(30)
    producer.begin_transaction()
    word = "committed" if commit else "aborted"
    for partition, n in per_partition.items():
        for i in range(n):
            producer.produce(topic, f"{word}-{partition}-{i}".encode(), f"k{i}".encode(), partition=partition)
    producer.flush(30)
    if commit:
        producer.commit_transaction(30)
    else:
        producer.abort_transaction(30)


def delete_records(bootstrap: str, topic: str, before: Mapping[int, int]) -> None:
    """DeleteRecords: the broker drops every record below each offset and moves the log start there."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    tps = [TopicPartition(topic, p, offset) for p, offset in before.items()]
    for tp, future in admin.delete_records(tps, operation_timeout=10, request_timeout=15).items():
        assert future.result().low_watermark == tp.offset, f"{tp.topic}:{tp.partition}"


def offsets(records: Iterable[Rec]) -> set[tuple[int, int]]:
    return {(r[0], r[1]) for r in records}


def by_partition(found: Iterable[tuple[int, int]]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for p, o in sorted(found):
        out.setdefault(p, []).append(o)
    return out


def spark_headers(value: Any) -> Headers:
    if value is None:
        return None
    return tuple((str(h["key"]), None if h["value"] is None else bytes(h["value"])) for h in value)


def arrow_headers(value: Any) -> Headers:
    if value is None:
        return None
    return tuple((str(h["key"]), h["value"]) for h in value)


# ------------------------------------------------------------------------------------------------------------------
# the peer: a Structured Streaming query over Spark's Kafka source


@dataclass(frozen=True)
class PeerBatch:
    batch_id: int
    at: float
    """``time.time()`` when ``foreachBatch`` was called."""
    tasks: int
    """Spark partitions of the batch's scan: the tasks that read it."""
    records: list[Rec]


@dataclass
class Collect:
    """The peer's ``foreachBatch``: keeps each non-empty batch's rows, task count and time (it runs in the driver's
    Python process, so what it keeps is there to read)."""

    batches: list[PeerBatch] = field(default_factory=list)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        at = time.time()
        tasks = batch.rdd.getNumPartitions()
        rows = batch.select("partition", "offset", "key", "value", "headers").collect()
        records = [
            (
                int(r["partition"]),
                int(r["offset"]),
                None if r["key"] is None else bytes(r["key"]),
                None if r["value"] is None else bytes(r["value"]),
                spark_headers(r["headers"]),
            )
            for r in rows
        ]
        if records:
            self.batches.append(PeerBatch(batch_id, at, tasks, sorted(records, key=lambda r: r[:2])))

    @property
    def records(self) -> list[Rec]:
        return [r for b in self.batches for r in b.records]

    @property
    def read(self) -> set[tuple[int, int]]:
        found = [(r[0], r[1]) for r in self.records]
        assert len(found) == len(set(found)), "the peer read no record twice"
        return set(found)


def start_peer(
    spark: SparkSession,
    bootstrap: str,
    topic: str,
    checkpoint: Path,
    options: Mapping[str, str | None] | None = None,
    *,
    trigger: str = AVAILABLE_NOW,
    collect: Collect | None = None,
) -> tuple[StreamingQuery, Collect]:
    """The peer's query: ``kafka_options`` (committed records, headers, from earliest) with ``options`` laid over
    them (``None`` removes one), into a collecting ``foreachBatch``, checkpointed at ``checkpoint``."""
    merged: dict[str, str] = dict(kafka_options(bootstrap, topic))
    for name, value in (options or {}).items():
        if value is None:
            merged.pop(name, None)
        else:
            merged[name] = value
    collect = collect if collect is not None else Collect()
    writer = spark.readStream.format("kafka").options(**merged).load().writeStream.foreachBatch(collect)
    writer = writer.option("checkpointLocation", str(checkpoint)).queryName(unique_name("peer-options"))
    if trigger == AVAILABLE_NOW:
        writer = writer.trigger(availableNow=True)
    elif trigger != DEFAULT_TRIGGER:
        writer = writer.trigger(processingTime=trigger)
    return writer.start(), collect


def run_peer(
    spark: SparkSession, bootstrap: str, topic: str, checkpoint: Path, options: Mapping[str, str | None] | None = None
) -> Collect:
    """One AvailableNow query to its end (bounded)."""
    query, collect = start_peer(spark, bootstrap, topic, checkpoint, options)
    try:
        await_query(query, QUERY_TIMEOUT_S)
    finally:
        if query.isActive:
            query.stop()
    return collect


def await_failure(query: StreamingQuery, timeout_s: float = QUERY_TIMEOUT_S) -> str:
    """Wait for a query that must fail; its error's text."""
    try:
        ended = query.awaitTermination(round(timeout_s))
    except StreamingQueryException as exc:
        return str(exc)
    finally:
        if query.isActive:
            query.stop()
    if not ended:
        raise TimeoutError(f"the peer's query {query.name} neither failed nor ended within {timeout_s:.0f} s")
    error = query.exception()
    assert error is not None, f"the peer's query {query.name} ended without failing"
    return str(error)


def trigger_times(query: StreamingQuery) -> dict[int, float]:
    """When each batch that read records was triggered (epoch seconds), from the query's progress reports (a
    trigger that found nothing new may report the next batch's id, with no rows)."""
    out: dict[int, float] = {}
    for progress in query.recentProgress:
        if progress.numInputRows > 0:
            out[int(progress.batchId)] = datetime.fromisoformat(progress.timestamp).timestamp()
    return out


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float, poll_s: float = 0.1) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(poll_s)


# ------------------------------------------------------------------------------------------------------------------
# our side: group members ticked directly


def member(
    store: StateStore, backend: KafkaBackend, group: str, member_id: str = "m0", **overrides: Any
) -> GroupMember:
    """A member as ``tests/reliability`` builds them (claims at once, any backlog launched at once), with a
    session long enough for the pauses of these tests, and the policy fields under test."""
    return member_of(store, backend, group, member_id, **{"session_timeout_s": 120.0, **overrides})


def read_launches(backend: KafkaBackend, launches: Sequence[Launch]) -> list[Rec]:
    """Every record of the launched ranges, read exactly as a run reads them."""
    out: list[Rec] = []
    for launch in launches:
        for batch in backend.read_range(launch.shard, launch.start, launch.end):
            for row in batch.to_pylist():
                out.append(
                    (int(row["partition"]), int(row["offset"]), row["key"], row["value"], arrow_headers(row["headers"]))
                )
    return out


@dataclass(frozen=True)
class OurRun:
    member_id: str
    at: float
    """``time.time()`` when the tick that launched it returned."""
    ranges: list[tuple[str, int, int]]
    records: int


@dataclass
class OurSide:
    """Members of one group; each tick's runs are read and committed at once, as the runs would."""

    members: list[GroupMember]
    records: list[Rec] = field(default_factory=list)
    runs: list[OurRun] = field(default_factory=list)
    reports: list[TickReport] = field(default_factory=list)

    def run(self, m: GroupMember, launches: Sequence[Launch]) -> None:
        for launches_of_run in runs_of(launches).values():
            read = read_launches(m.backend, launches_of_run)  # type: ignore[arg-type]
            self.records += read
            ranges = [(x.shard, x.start, x.end) for x in launches_of_run]
            self.runs.append(OurRun(m.member_id, time.time(), ranges, len(read)))
            outcome = m.commit_run([report_of(x) for x in launches_of_run])
            assert outcome.accepted, outcome.refusals

    def step(self) -> int:
        """Every member ticks, then the runs they launched are read and committed; the records launched."""
        launched: list[tuple[GroupMember, list[Launch]]] = []
        for m in self.members:
            report = m.tick()
            self.reports.append(report)
            if report.new_launches:
                launched.append((m, report.new_launches))
        for m, launches in launched:
            self.run(m, launches)
        return sum(x.records for _, launches in launched for x in launches)

    def drain(self, ticks: int = 20) -> None:
        """Step until a step launches nothing."""
        for _ in range(ticks):
            if not self.step():
                return
        raise AssertionError(f"the group still launched ranges after {ticks} ticks")

    @property
    def read(self) -> set[tuple[int, int]]:
        found = [(r[0], r[1]) for r in self.records]
        assert len(found) == len(set(found)), "our side read no record twice"
        return set(found)

    @property
    def events(self) -> list[tuple[str, str | None, int | None, int | None]]:
        seen: list[tuple[str, str | None, int | None, int | None]] = []
        for report in self.reports:
            seen += [(str(e.kind), e.shard, e.start, e.end) for e in report.new_events]
        return seen


def our_side(
    bootstrap: str, topic: str, *member_ids: str, properties: Mapping[str, str] | None = None, **policy: Any
) -> OurSide:
    """A new group (its own memory store) of ``member_ids`` (``m0`` alone by default), each over its own backend."""
    store = MemoryStore(time.time)
    group = unique_name("g")
    return OurSide(
        [
            member(store, kafka_backend(bootstrap, topic, **dict(properties or {})), group, m, **policy)
            for m in member_ids or ("m0",)
        ]
    )


# ------------------------------------------------------------------------------------------------------------------
# minPartitions, maxRecordsPerPartition


def test_min_partitions_and_max_records_per_partition_read_the_same_records_as_our_split(
    kafka_bootstrap: str, kafka_topics: TopicFactory, spark: SparkSession, tmp_path: Path
) -> None:
    """One partition far larger than the others: Spark's ``minPartitions`` splits it in proportion, its
    ``maxRecordsPerPartition`` in pieces of at most that many offsets; our run's ranges through our Spark source
    with the same options (``spark_split_records`` is its ``maxRecordsPerPartition``). The records are the same;
    the task counts are reported, as Spark's rounding and ours differ."""
    topic = kafka_topics(3, prefix="peer-split")
    written = produce(kafka_bootstrap, topic, {0: 100, 1: 10, 2: 10}, "split")
    min_partitions, max_records = 6, 30

    started = {
        "min": start_peer(spark, kafka_bootstrap, topic, tmp_path / "min", {"minPartitions": str(min_partitions)}),
        "max": start_peer(
            spark, kafka_bootstrap, topic, tmp_path / "max", {"maxRecordsPerPartition": str(max_records)}
        ),
    }
    peer: dict[str, Collect] = {}
    for name, (query, collect) in started.items():
        try:
            await_query(query, QUERY_TIMEOUT_S)
        finally:
            if query.isActive:
                query.stop()
        peer[name] = collect

    ours = our_side(kafka_bootstrap, topic)
    [m] = ours.members
    report = m.tick()
    assert len(runs_of(report.new_launches)) == 1, "one run over the three ranges"
    ranges = {x.shard: (x.start, x.end) for x in report.new_launches}
    config = m.backend.config  # type: ignore[attr-defined]
    frames = {
        "min": read_kafka_ranges(spark, config, ranges, min_partitions=min_partitions),
        "max": read_kafka_ranges_by("python", spark, config, ranges, split_records=max_records),
    }
    our_tasks = {name: df.rdd.getNumPartitions() for name, df in frames.items()}
    our_read = {
        name: {(int(r[0]), int(r[1])) for r in df.select("partition", "offset").collect()}
        for name, df in frames.items()
    }
    assert m.commit_run([report_of(x) for x in report.new_launches]).accepted

    for name, option in (("min", f"minPartitions={min_partitions}"), ("max", f"maxRecordsPerPartition={max_records}")):
        [batch] = peer[name].batches
        tasks = f"{option}: Spark {batch.tasks} tasks, ours {our_tasks[name]}"
        print(f"split {tasks}")
        assert peer[name].read == our_read[name] == written, tasks
    assert (peer["min"].batches[0].tasks, our_tasks["min"]) == (6, 7), (
        "minPartitions=6 over 100, 10 and 10 records: Spark keeps the two small ranges whole and splits the large one "
        "in 4; ours rounds 100 / 120 * 6 to 5 pieces and keeps the small ones whole (docs/kafka.md cites these)"
    )
    assert our_tasks["max"] == peer["max"].batches[0].tasks == 4 + 1 + 1, "ceil(100 / 30) + 1 + 1 on both sides"


# ------------------------------------------------------------------------------------------------------------------
# maxOffsetsPerTrigger


def test_max_offsets_per_trigger_caps_a_micro_batch_and_max_records_per_run_a_member_run(
    kafka_bootstrap: str, kafka_topics: TopicFactory, spark: SparkSession, tmp_path: Path
) -> None:
    """The same offsets to the end in batches / runs of at most the cap; Spark's cap holds for the whole query's
    micro-batch, ours for each member's run, so two members have more than the cap in flight at once."""
    topic = kafka_topics(3, prefix="peer-cap")
    written = produce(kafka_bootstrap, topic, {0: 40, 1: 25, 2: 7}, "cap")
    cap = 20

    peer = run_peer(spark, kafka_bootstrap, topic, tmp_path / "peer", {"maxOffsetsPerTrigger": str(cap)})

    ours = our_side(kafka_bootstrap, topic, "m0", "m1", max_records_per_run=cap, join_grace_s=0.3)
    for m in ours.members:
        assert not m.tick().new_launches, "both members register inside the join grace; nobody claims yet"
    time.sleep(0.35)
    in_flight: list[int] = []
    for _ in range(20):
        launched = ours.step()
        if not launched:
            break
        in_flight.append(launched)

    spark_sizes = [len(b.records) for b in peer.batches]
    our_sizes = [(r.member_id, r.records) for r in ours.runs]
    sizes = f"Spark's micro-batches {spark_sizes}; our runs {our_sizes}; in flight at once {in_flight}"
    print(f"maxOffsetsPerTrigger={cap}: {sizes}")
    assert peer.read == ours.read == written, sizes
    assert all(n <= cap for n in spark_sizes) and len(spark_sizes) >= -(-len(written) // cap), sizes
    assert all(n <= cap for _, n in our_sizes), sizes
    assert {m for m, _ in our_sizes} == {"m0", "m1"}, "both members ran"
    assert max(in_flight) > cap, f"two members read more than one member's cap at once: {sizes}"


# ------------------------------------------------------------------------------------------------------------------
# minOffsetsPerTrigger with maxTriggerDelay


def test_min_offsets_per_trigger_with_max_trigger_delay_and_min_backlog_with_max_wait(
    kafka_bootstrap: str, kafka_topics: TopicFactory, spark: SparkSession, tmp_path: Path
) -> None:
    """A small backlog under the minimum is read once the delay has passed, on both sides, and nothing is lost;
    but Spark counts the delay from its previous trigger and ours from the first tick that saw the backlog:

    - a backlog there before either side starts: ours waits ``max_wait_s`` from its first tick; Spark's first
      trigger has no previous one and reads it at once;
    - records written 1.5 s after Spark's trigger: Spark reads them ``maxTriggerDelay`` after that trigger (less
      than the delay after they appeared); ours ``max_wait_s`` after its first tick that saw them."""
    topic = kafka_topics(2, prefix="peer-min")
    minimum, delay = 1_000, 4.0
    first = produce(kafka_bootstrap, topic, {0: 3, 1: 3}, "first")

    ours = our_side(kafka_bootstrap, topic, min_backlog=minimum, max_wait_s=delay)
    seen_first = time.time()
    wait_for(lambda: ours.step() > 0, "our first run", delay + 15, 0.2)
    ours_first = ours.runs[0].at - seen_first
    assert ours.read == first
    assert ours_first >= delay, f"ours waited {ours_first:.2f} s from its first tick, not max_wait_s ({delay} s)"

    started = time.time()
    query, peer = start_peer(
        spark,
        kafka_bootstrap,
        topic,
        tmp_path / "peer",
        {"minOffsetsPerTrigger": str(minimum), "maxTriggerDelay": f"{delay:g}s"},
        trigger="500 milliseconds",
    )
    try:
        wait_for(lambda: 0 in trigger_times(query), "the peer's first batch", QUERY_TIMEOUT_S)
        first_trigger = trigger_times(query)[0]
        assert offsets(peer.batches[0].records) == first
        assert first_trigger - started < delay, (
            f"Spark's first trigger read the small backlog {first_trigger - started:.2f} s after the query started: "
            "its delay counts from the previous trigger, and a new query has none"
        )

        time.sleep(max(0.0, first_trigger + 1.5 - time.time()))
        produced_at = time.time()
        assert produced_at < first_trigger + delay - 1, "the new records are written well inside Spark's delay"
        later = produce(kafka_bootstrap, topic, {0: 2, 1: 2}, "later")

        def both_read_later() -> bool:
            if not later <= ours.read:
                ours.step()
            return later <= ours.read and later <= peer.read and 1 in trigger_times(query)

        wait_for(both_read_later, "both sides reading the later records", delay + 20, 0.2)
        second_trigger = trigger_times(query)[1]
    finally:
        query.stop()

    ours_later = ours.runs[-1].at - produced_at
    spark_later = second_trigger - produced_at
    timeline = (
        f"ours: first backlog after {ours_first:.2f} s, later records after {ours_later:.2f} s; Spark: first "
        f"backlog {first_trigger - started:.2f} s after its start, later records {spark_later:.2f} s after they "
        f"were written and {second_trigger - first_trigger:.2f} s after its previous trigger (delay {delay:g} s)"
    )
    print(f"minOffsetsPerTrigger / maxTriggerDelay: {timeline}")
    assert peer.read == ours.read == first | later, timeline
    assert [offsets(b.records) for b in peer.batches] == [first, later], "two batches, neither before its delay"
    assert second_trigger - first_trigger >= delay - 0.5, timeline
    assert spark_later < delay, f"Spark's delay counts from its previous trigger, not from the records: {timeline}"
    assert ours_later >= delay, f"ours waits max_wait_s from the first tick that saw the records: {timeline}"
    assert [len(r.ranges) for r in ours.runs] == [2, 2], "one run per backlog over both partitions"


# ------------------------------------------------------------------------------------------------------------------
# startingOffsets


def test_starting_offsets_latest_and_seek_latest(
    kafka_bootstrap: str, kafka_topics: TopicFactory, spark: SparkSession, tmp_path: Path
) -> None:
    """``startingOffsets=latest`` and ``seek="latest"`` skip what is there at the start and read what comes
    after, the same records. Then both lose their position (a new checkpoint; a new state store): Spark starts
    over at the latest offsets and skips what was written meanwhile, ours resumes at the group's Kafka offsets
    (the seek applies only to a shard the group never committed)."""
    topic = kafka_topics(2, prefix="peer-latest")
    produce(kafka_bootstrap, topic, {0: 3, 1: 3}, "before")
    latest = {"startingOffsets": "latest"}

    assert run_peer(spark, kafka_bootstrap, topic, tmp_path / "peer", latest).batches == []
    ours = our_side(kafka_bootstrap, topic, seek="latest")
    ours.drain()
    assert ours.runs == [], "positioned at the end, nothing launched"

    after = produce(kafka_bootstrap, topic, {0: 2, 1: 2}, "after")
    peer = run_peer(spark, kafka_bootstrap, topic, tmp_path / "peer", latest)  # resumes from its checkpoint
    ours.drain()
    assert peer.read == ours.read == after

    meanwhile = produce(kafka_bootstrap, topic, {0: 2, 1: 1}, "meanwhile")
    fresh = run_peer(spark, kafka_bootstrap, topic, tmp_path / "new-checkpoint", latest)
    [old] = ours.members
    resumed = OurSide([member(MemoryStore(time.time), kafka_backend(kafka_bootstrap, topic), old.group, seek="latest")])
    resumed.drain()
    assert fresh.read == set(), "a new checkpoint applies startingOffsets again: what was written meanwhile is skipped"
    assert resumed.read == meanwhile, "a lost state resumes at the group's Kafka offsets, not at the seek"


# ------------------------------------------------------------------------------------------------------------------
# startingOffsetsByTimestamp, startingTimestamp


def test_starting_offsets_by_timestamp_and_seek_timestamp(
    kafka_bootstrap: str, kafka_topics: TopicFactory, spark: SparkSession, tmp_path: Path
) -> None:
    """Records in two eras of time; both sides start each partition at the first record at or after the
    timestamp (the broker's offsets-for-times, so a partition whose times go back reads its older record past
    that point too). A partition with no record that recent: Spark's query fails by default
    (``startingOffsetsByTimestampStrategy=error``), ours starts it at its end, as Spark's ``latest`` strategy
    does. A partition added later is read from its first offset on both sides, whatever the timestamp."""
    topic = kafka_topics(3, prefix="peer-time")
    now = int(time.time() * 1000)
    old, since, recent = now - 1_200_000, now - 600_000, now - 300_000
    times = {
        0: [old, old + 1, old + 2, since, recent, recent + 1],
        1: [old, recent, recent + 1, old + 5, recent + 2],  # an old time past the first recent record
        2: [old, old + 1],  # nothing that recent
    }
    written = produce(kafka_bootstrap, topic, {p: len(t) for p, t in times.items()}, "time", timestamps_ms=times)
    expected = {(0, o) for o in range(3, 6)} | {(1, o) for o in range(1, 5)}
    assert expected <= written

    by_partition_ts = json.dumps({topic: {str(p): since for p in times}})
    global_ts, _ = start_peer(
        spark,
        kafka_bootstrap,
        topic,
        tmp_path / "global",
        {"startingOffsets": None, "startingTimestamp": str(since)},
    )
    latest_strategy = {
        "startingOffsets": None,
        "startingOffsetsByTimestamp": by_partition_ts,
        "startingOffsetsByTimestampStrategy": "latest",
    }
    by_ts, peer = start_peer(spark, kafka_bootstrap, topic, tmp_path / "by-timestamp", latest_strategy)
    error = await_failure(global_ts)
    try:
        await_query(by_ts, QUERY_TIMEOUT_S)
    finally:
        if by_ts.isActive:
            by_ts.stop()

    ours = our_side(kafka_bootstrap, topic, seek="timestamp", seek_timestamp_ms=since)
    ours.drain()
    assert "No offset matched" in error and f"{since}" in error, error
    assert peer.read == ours.read == expected, (by_partition(peer.read), by_partition(ours.read))
    state = ours.members[0].load()
    assert state is not None and state.shards[f"{topic}:2"].committed == 2, "ours starts partition 2 at its end"

    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_partitions([NewPartitions(topic, 4)])[topic].result()
    wait_for(lambda: len(ours.members[0].backend.shards()) == 4, "the new partition", 15)
    added = produce(
        kafka_bootstrap, topic, {2: 1, 3: 4}, "added", timestamps_ms={2: [old + 9], 3: [old, old + 1, recent, old + 2]}
    )
    ours_before = ours.read
    again = run_peer(spark, kafka_bootstrap, topic, tmp_path / "by-timestamp", latest_strategy)  # its checkpoint
    ours.drain()
    assert again.read == ours.read - ours_before == added, (by_partition(again.read), by_partition(ours.read))
    assert {(3, o) for o in range(4)} <= again.read, "the added partition from its first offset, old times included"


# ------------------------------------------------------------------------------------------------------------------
# failOnDataLoss


def test_fail_on_data_loss_and_on_data_loss(
    kafka_bootstrap: str, kafka_topics: TopicFactory, spark: SparkSession, tmp_path: Path
) -> None:
    """Both sides read ``[0, 10)`` of two partitions and hold it committed (Spark in its checkpoint, ours in the
    group state); ten more records each; then partition 0's records below 15 are deleted, past both sides'
    position. ``failOnDataLoss=true`` fails Spark's whole query (partition 1's new records unread too);
    ``on_data_loss="fail"`` parks partition 0 with an event and partition 1 goes on. ``failOnDataLoss=false`` and
    ``on_data_loss="earliest"`` both skip to the log start and read the same records."""
    topic = kafka_topics(2, prefix="peer-loss")
    first = produce(kafka_bootstrap, topic, {0: 10, 1: 10}, "first")
    checkpoint = tmp_path / "checkpoint"
    assert run_peer(spark, kafka_bootstrap, topic, checkpoint).read == first
    fail_side = our_side(kafka_bootstrap, topic, on_data_loss="fail")
    skip_side = our_side(kafka_bootstrap, topic, on_data_loss="earliest")
    for side in (fail_side, skip_side):
        side.drain()
        assert side.read == first

    later = produce(kafka_bootstrap, topic, {0: 10, 1: 10}, "later")
    delete_records(kafka_bootstrap, topic, {0: 15})
    surviving = {(p, o) for p, o in later if p == 1 or o >= 15}
    shutil.copytree(checkpoint, tmp_path / "checkpoint-fail")
    shutil.copytree(checkpoint, tmp_path / "checkpoint-skip")

    failing, failed_peer = start_peer(
        spark, kafka_bootstrap, topic, tmp_path / "checkpoint-fail", {"failOnDataLoss": "true"}
    )
    error = await_failure(failing)
    skipping = run_peer(spark, kafka_bootstrap, topic, tmp_path / "checkpoint-skip", {"failOnDataLoss": "false"})
    fail_side.drain()
    skip_side.drain()

    shard0 = f"{topic}:0"
    print(f"failOnDataLoss=true: {error.splitlines()[0][:300]}")
    assert "failOnDataLoss" in error and "10" in error, error
    assert failed_peer.read == set(), "Spark's failed query read nothing: partition 1's records wait with it"
    assert fail_side.read - first == {(1, o) for o in range(10, 20)}, "ours parks partition 0, partition 1 goes on"
    state = fail_side.members[0].load()
    assert state is not None and state.shards[shard0].parked is not None
    assert (str(EventKind.DATA_LOSS), shard0, 10, 15) in fail_side.events
    assert skipping.read == skip_side.read - first == surviving
    assert (str(EventKind.DATA_LOSS), shard0, 10, 15) in skip_side.events


# ------------------------------------------------------------------------------------------------------------------
# includeHeaders


def test_include_headers_and_our_headers(
    kafka_bootstrap: str, kafka_topics: TopicFactory, spark: SparkSession, tmp_path: Path
) -> None:
    """Headers of every kind (repeated keys in order, an empty value, a null value, a non-ASCII key, binary
    values, none at all) come out the same on both sides: Spark with ``includeHeaders=true``, ours always. Without
    the option Spark's source has no ``headers`` column."""
    topic = kafka_topics(2, prefix="peer-headers")
    headers: list[list[tuple[str, bytes | None]] | None] = [
        [("a", b"1"), ("a", b"2"), ("b", b"3")],
        [("empty", b"")],
        [("null", None)],
        [("ünïcödé", b"\x00\xff\xfe")],
        None,
        [("trace-id", b"abc"), ("a", None), ("a", b"")],
    ]
    for p in (0, 1):
        produce_records(
            kafka_bootstrap, topic, p, [f"h-{p}-{i}".encode() for i in range(len(headers))], headers=headers
        )

    peer = run_peer(spark, kafka_bootstrap, topic, tmp_path / "peer")
    ours = our_side(kafka_bootstrap, topic)
    ours.drain()

    peer_headers = {(r[0], r[1]): r[4] for r in peer.records}
    our_headers = {(r[0], r[1]): r[4] for r in ours.records}
    assert peer_headers == our_headers
    assert our_headers[(0, 0)] == (("a", b"1"), ("a", b"2"), ("b", b"3"))
    assert our_headers[(1, 2)] == (("null", None),)
    assert our_headers[(0, 4)] is None, "a record without headers has null headers on both sides"
    assert [(r[0], r[1], r[2], r[3]) for r in sorted(peer.records)] == [
        (r[0], r[1], r[2], r[3]) for r in sorted(ours.records, key=lambda r: r[:2])
    ]
    options = dict(kafka_options(kafka_bootstrap, topic))
    options.pop("includeHeaders")
    assert "headers" not in spark.readStream.format("kafka").options(**options).load().columns


# ------------------------------------------------------------------------------------------------------------------
# kafka.isolation.level


def test_isolation_level_read_committed_and_read_uncommitted(
    kafka_bootstrap: str, kafka_topics: TopicFactory, spark: SparkSession, tmp_path: Path
) -> None:
    """An aborted transaction between plain records and a committed transaction: under ``read_committed`` both
    sides read the same records without the aborted ones; under ``read_uncommitted`` both read the aborted ones
    too, and Spark's default (no ``kafka.isolation.level``) is ``read_uncommitted``."""
    topic = kafka_topics(2, prefix="peer-isolation")
    plain = produce(kafka_bootstrap, topic, {0: 3, 1: 3}, "plain")
    transaction(kafka_bootstrap, topic, {0: 4, 1: 4}, commit=False)
    transaction(kafka_bootstrap, topic, {0: 2, 1: 2}, commit=True)
    tail = produce(kafka_bootstrap, topic, {0: 2, 1: 2}, "tail")

    levels: dict[str, dict[str, str | None]] = {
        "read_committed": {"kafka.isolation.level": "read_committed"},
        "read_uncommitted": {"kafka.isolation.level": "read_uncommitted"},
        "spark_default": {"kafka.isolation.level": None},
    }
    started = {
        name: start_peer(spark, kafka_bootstrap, topic, tmp_path / name, options) for name, options in levels.items()
    }
    peer: dict[str, Collect] = {}
    for name, (query, collect) in started.items():
        try:
            await_query(query, QUERY_TIMEOUT_S)
        finally:
            if query.isActive:
                query.stop()
        peer[name] = collect

    committed_side = our_side(kafka_bootstrap, topic)
    uncommitted_side = our_side(kafka_bootstrap, topic, properties={"isolation.level": "read_uncommitted"})
    committed_side.drain()
    uncommitted_side.drain()

    def values(records: Iterable[Rec]) -> list[str]:
        return sorted((r[3] or b"").decode() for r in records)

    aborted = {(r[0], r[1]) for r in uncommitted_side.records if (r[3] or b"").startswith(b"aborted-")}
    assert len(aborted) == 8
    assert peer["read_committed"].read == committed_side.read
    assert len(committed_side.read) == len(plain) + 4 + len(tail)
    assert not [v for v in values(committed_side.records) if v.startswith("aborted-")]
    assert peer["read_uncommitted"].read == uncommitted_side.read == committed_side.read | aborted
    assert peer["spark_default"].read == uncommitted_side.read, "Spark's default is read_uncommitted"
    assert values(peer["read_uncommitted"].records) == values(uncommitted_side.records)
