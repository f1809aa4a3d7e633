"""``python -m bench.lifecycle``: a group drains topics while they live their whole life, then a check.

``python -m bench.lifecycle [--backend kafka] [--records 200000] [--operations 20] [--seed 1] [--topics 3]
[--partitions 3] [--members 3] [--rate 2500] [--timeout 1200]`` (``--backend v3io``: ``bench.lifecycle.v3io``)

1. A local Apache Kafka broker of its own, ``--topics`` topics of ``--partitions`` partitions, and a group of
   ``--members`` members (``GroupMember`` ticks over a SQLite state store, each member a thread, each run a
   thread that reads its ranges with the backend's exact range reader, then commits through its member and
   mirrors the offsets), with ``on_recreated="earliest"`` and ``on_data_loss="earliest"`` so the drain goes on by
   itself. A producer writes ``--records`` records at ``--rate`` records/s over every topic that exists, each
   record naming its topic version and partition; what counts as written is what the broker acknowledged.
2. While they drain, ``--operations`` lifecycle operations (seeded: every kind once, then at random):
   ``recreate_fewer`` / ``recreate_more`` (a topic deleted and created again with fewer / more partitions),
   ``recreate_late`` (deleted, missing for longer than a session timeout, then created again), ``add_topic``
   (a topic added to the members' lists, one member after another: new, or one removed before),
   ``remove_topic`` (taken off the lists, one member after another), ``delete_records`` (DeleteRecords on a
   partition up to a random offset), ``kafka_tool_reset`` (Kafka's own ``kafka-consumer-groups --reset-offsets``
   on a topic: to earliest, latest or an offset), ``state_wipe`` (the state store replaced by an empty one
   between two commits: a lost store).
3. Then the drain: until every partition of every topic on the list has its committed offset at its end.
4. The check (``bench.lifecycle.check``): every record each topic version held is read exactly once by a
   committed run, or reported by an event naming it. A reset with Kafka's tool must be refused (an event, and
   the group's offsets in Kafka restored). The last line is one JSON object; ``passed`` is false, and the exit
   code 1, for anything lost, read twice, read from the wrong topic version, a tool reset not refused, a backlog
   not drained, or an error of the driver.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import random
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException, Message, Producer, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from bench.lifecycle.check import Event, Evidence, ReadRange, Version, check, payload, summary
from dagster_streamgroup import protocol
from dagster_streamgroup.local.kafka_broker import java_binary, kafka_libs, running_broker
from dagster_streamgroup.member import ContentionError, GroupMember
from dagster_streamgroup.protocol import GroupPolicy, Launch, StateFormatError
from dagster_streamgroup.stores.sql import SqlStateStore
from dagster_streamgroup.streams.base import StreamError
from dagster_streamgroup.streams.kafka import KAFKA_ARROW_SCHEMA, KafkaBackend, PartitionRange, parse_shard, read_ranges
from dagster_streamgroup.streams.kafka_config import KafkaStreamConfig

KINDS = (
    "recreate_fewer",
    "recreate_more",
    "recreate_late",
    "add_topic",
    "remove_topic",
    "delete_records",
    "kafka_tool_reset",
    "state_wipe",
)
POLICY = GroupPolicy(
    heartbeat_interval_s=1,
    session_timeout_s=6,
    join_grace_s=0,
    drain_timeout_s=30,
    min_backlog=1,
    max_wait_s=0,
    max_records_per_run=20_000,
    max_attempts=5,
    on_recreated="earliest",
    on_data_loss="earliest",
)
STALL_S = 5.0
"""A run reading a topic deleted under it fails after this long without progress (and is retried)."""


@dataclass(frozen=True)
class Options:
    records: int = 200_000
    operations: int = 20
    seed: int = 1
    topics: int = 3
    partitions: int = 3
    members: int = 3
    rate: float = 2500.0
    timeout_s: float = 1200.0


def plan(operations: int, seed: int) -> list[str]:
    """Every kind once (shuffled), then kinds at random: the same list for the same seed."""
    rng = random.Random(seed)
    kinds = list(KINDS)
    rng.shuffle(kinds)
    while len(kinds) < operations:
        kinds.append(rng.choice(KINDS))
    return kinds[: max(operations, 0)]


class SharedLock:
    """Runs commit and mirror under the shared side, a state wipe takes the exclusive side: a store is lost
    between two commits, never between a commit and its mirror (what the product then re-reads is documented,
    and not what this run measures)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._exclusive)
            self._shared += 1
        try:
            yield
        finally:
            with self._cond:
                self._shared -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._exclusive)
            self._exclusive = True
            self._cond.wait_for(lambda: self._shared == 0)
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()


@dataclass
class World:
    """Everything the driver knows and records, shared by its threads."""

    bootstrap: str
    group: str
    work: Path
    store: SqlStateStore
    lock: threading.Lock = field(default_factory=threading.Lock)
    commits: SharedLock = field(default_factory=SharedLock)
    versions: dict[str, Version] = field(default_factory=dict)
    """Current version of each topic that exists (by name)."""
    all_versions: list[Version] = field(default_factory=list)
    acked: dict[tuple[str, int, int], dict[int, bytes]] = field(default_factory=dict)
    reads: list[ReadRange] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    paused: set[str] = field(default_factory=set)
    stores: int = 0
    runs: Counter[str] = field(default_factory=Counter)
    tick_errors: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    produced: int = 0

    def record_events(self, events: Sequence[protocol.GroupEvent]) -> None:
        with self.lock:
            self.events += [Event(e.kind.value, e.shard, e.start, e.end, e.detail, e.at) for e in events]


def topic_id(admin: AdminClient, topic: str) -> str:
    return str(admin.describe_topics(TopicCollection([topic]))[topic].result().topic_id)


def _until(condition: Any, timeout_s: float, poll_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(poll_s)
    return bool(condition())


class Member:
    """One group member: a thread that ticks once per heartbeat and starts a thread per run it must launch."""

    def __init__(self, world: World, member_id: str, topics: list[str]) -> None:
        self.world = world
        self.member_id = member_id
        self.topics = list(topics)
        self._backend_topics: list[str] = []
        self._backend: KafkaBackend | None = None
        self.started: set[str] = set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, name=f"member-{member_id}", daemon=True)

    def backend(self) -> KafkaBackend:
        topics = list(self.topics)
        if self._backend is None or topics != self._backend_topics:
            if self._backend is not None:
                self._backend.close()
            config = KafkaStreamConfig(bootstrap_servers=self.world.bootstrap, topics=topics)
            self._backend = KafkaBackend(config, request_timeout_s=10.0, stall_timeout_s=STALL_S)
            self._backend_topics = topics
        return self._backend

    def member(self) -> GroupMember:
        return GroupMember(self.world.store, self.backend(), self.world.group, self.member_id, POLICY)

    def loop(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                member = self.member()
                report = member.tick()
            except Exception as exc:  # a tick that fails waits for the next, as a member sensor's does
                self.world.tick_errors[type(exc).__name__] += 1
                if not isinstance(exc, StreamError | ContentionError | StateFormatError):
                    self.world.errors.append(f"tick of {self.member_id}: {type(exc).__name__}: {exc}")
                time.sleep(POLICY.heartbeat_interval_s)
                continue
            self.world.record_events(report.new_events)
            for run_key, launches in protocol.runs_of(report.to_request).items():
                if run_key in self.started:
                    continue
                self.started.add(run_key)
                threading.Thread(target=self.guarded_run, args=(member.backend, launches), daemon=True).start()
            self.stop.wait(max(0.0, POLICY.heartbeat_interval_s - (time.monotonic() - started)))
        if self._backend is not None:
            self._backend.close()

    def guarded_run(self, backend: KafkaBackend, launches: list[Launch]) -> None:
        try:
            self.run(backend, launches)
        except Exception as exc:
            self.world.errors.append(f"run {launches[0].run_key}: {type(exc).__name__}: {exc}")

    def run(self, backend: KafkaBackend, launches: list[Launch]) -> None:
        """What a run does: read its ranges exactly, commit them (fenced), mirror the offsets."""
        world = self.world
        reports = [protocol.report_of(x) for x in launches]
        parts = [PartitionRange(*parse_shard(x.shard), x.start, x.end) for x in launches]
        try:
            batches = list(read_ranges(backend.config.client_config(), parts, stall_timeout_s=STALL_S))
        except StreamError as exc:
            world.runs["read_failed"] += 1
            self._fail(backend, reports, f"{type(exc).__name__}: {exc}")
            return
        table = pa.Table.from_batches(batches, schema=KAFKA_ARROW_SCHEMA)
        rows = table.select(["topic", "partition", "offset", "value"])
        records: dict[str, list[tuple[int, bytes]]] = {x.shard: [] for x in launches}
        for row in rows.to_pylist():
            records[f"{row['topic']}:{row['partition']}"].append((int(row["offset"]), bytes(row["value"])))
        with world.commits.shared():
            member = GroupMember(world.store, backend, world.group, self.member_id, POLICY)
            try:
                outcome, stats = member.commit_run_state_only(reports)
            except (StreamError, ContentionError, StateFormatError) as exc:
                world.runs["commit_failed"] += 1
                self._fail(backend, reports, str(exc))
                return
            if not outcome.accepted:
                world.runs["refused"] += 1
                self._fail(backend, reports, f"commit refused: {outcome.message}")
                return
            fresh = {x.shard: x.end for x in launches if not outcome.outcomes[x.shard].already_committed}
            if fresh:
                try:
                    member.mirror(fresh, stats.state)
                except StreamError as exc:
                    world.runs["mirror_failed"] += 1
                    world.errors.append(f"mirror of {sorted(fresh)} failed: {exc}")
        world.runs["committed"] += 1
        state = stats.state
        with world.lock:
            for x in launches:
                if x.shard in fresh:
                    identity = state.shards[x.shard].identity if state is not None else None
                    world.reads.append(ReadRange(x.shard, identity, x.start, x.end, tuple(records[x.shard])))

    def _fail(self, backend: KafkaBackend, reports: list[protocol.RangeReport], reason: str) -> None:
        """The run ended failed: reported as the member sensor reports a failed run (its ranges retried)."""
        with contextlib.suppress(StreamError, ContentionError, StateFormatError):
            GroupMember(self.world.store, backend, self.world.group, self.member_id, POLICY).fail_run(
                reports, reason[:300]
            )


class RecordWriter:
    """Writes records round-robin over every topic that exists (but those paused for an operation), each
    naming its topic version; what counts is what the broker acknowledged."""

    def __init__(self, world: World, total: int, rate: float) -> None:
        self.world = world
        self.total = total
        self.rate = rate
        self.producer = Producer(
            {"bootstrap.servers": world.bootstrap, "enable.idempotence": True, "linger.ms": 5, "acks": "all"}
        )
        self.seq = 0
        self.failed = 0
        self.done = threading.Event()
        self.batch = threading.Lock()
        """Held while a batch is handed to the producer: ``pause`` waits for it, so nothing is written after."""
        self.thread = threading.Thread(target=self.loop, name="producer", daemon=True)

    def on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.failed += 1
            return
        value = bytes(msg.value() or b"")
        topic, number, partition = value.decode().split("|")[:3]
        with self.world.lock:
            self.world.acked.setdefault((topic, int(number), int(partition)), {})[int(msg.offset() or 0)] = value
            self.world.produced += 1

    def loop(self) -> None:
        try:
            self._loop()
        except Exception as exc:
            self.world.errors.append(f"producer: {type(exc).__name__}: {exc}")
        finally:
            self.done.set()

    def _loop(self) -> None:
        started = time.monotonic()
        while self.seq < self.total:
            due = int((time.monotonic() - started) * self.rate)
            if self.seq >= due:
                self.producer.poll(0.01)
                continue
            with self.batch:
                self._batch(min(500, due - self.seq, self.total - self.seq))
            self.producer.poll(0)
        self.producer.flush(60)

    def _batch(self, size: int) -> None:
        with self.world.lock:
            live = [v for name, v in self.world.versions.items() if name not in self.world.paused]
        for _ in range(size if live else 0):
            version = live[self.seq % len(live)]
            partition = (self.seq // len(live)) % version.partitions
            value = payload(version.topic, version.number, partition, self.seq)
            try:
                self.producer.produce(version.topic, value, partition=partition, on_delivery=self.on_delivery)
            except BufferError:
                self.producer.poll(0.1)
                return
            except KafkaException:  # a partition the client's metadata does not show yet (a topic just created)
                self.producer.poll(0.1)
                return
            self.seq += 1

    def pause(self, topic: str) -> None:
        """Stop writing to ``topic`` and wait until every record written to it was acknowledged (or failed)."""
        with self.world.lock:
            self.world.paused.add(topic)
        with self.batch:
            self.producer.flush(60)

    def resume(self, topic: str) -> None:
        with self.world.lock:
            self.world.paused.discard(topic)


class Driver:
    def __init__(self, options: Options, bootstrap: str, work: Path) -> None:
        self.o = options
        self.rng = random.Random(options.seed)
        self.admin = AdminClient({"bootstrap.servers": bootstrap})
        run = uuid.uuid4().hex[:6]
        self.world = World(bootstrap, f"lifecycle-{run}", work, SqlStateStore(f"sqlite:///{work / 'state-0.db'}"))
        self.prefix = f"lc-{run}"
        self.names = 0
        self.listed: list[str] = []
        self.removed: list[str] = []
        self.off_list: dict[str, list[tuple[float, float | None]]] = {}
        """Topic -> when it was taken off the lists and when it was put back (None: not yet)."""
        self.members: list[Member] = []
        self.producer = RecordWriter(self.world, options.records, options.rate)
        self.operations: Counter[str] = Counter()
        self.tool_resets: Counter[str] = Counter()
        self.op_log: list[str] = []

    def create(self, topic: str, partitions: int) -> Version:
        futures = self.admin.create_topics([NewTopic(topic, partitions, 1)], operation_timeout=30)
        futures[topic].result()
        _until(lambda: len(self.admin.list_topics(topic, timeout=10).topics[topic].partitions) == partitions, 30)
        with self.world.lock:
            number = sum(1 for v in self.world.all_versions if v.topic == topic)
        version = Version(topic, number, topic_id(self.admin, topic), partitions, time.time())
        with self.world.lock:
            self.world.versions[topic] = version
            self.world.all_versions.append(version)
        return version

    def delete(self, topic: str) -> None:
        for future in self.admin.delete_topics([topic], operation_timeout=30).values():
            future.result()
        _until(lambda: topic not in self.admin.list_topics(timeout=10).topics, 30)
        with self.world.lock:
            self.world.versions.pop(topic, None)

    def new_topic(self) -> str:
        self.names += 1
        topic = f"{self.prefix}-{self.names}"
        self.create(topic, self.o.partitions)
        return topic

    def set_lists(self, topics: list[str]) -> None:
        """The members' lists changed one member after another (a rolling change: they disagree meanwhile)."""
        self.listed = list(topics)
        for member in self.members:
            member.topics = list(topics)
            time.sleep(POLICY.heartbeat_interval_s)

    # -- operations ---------------------------------------------------------------------------------------------

    def recreate(self, kind: str) -> str:
        topic = self.rng.choice(sorted(self.world.versions))
        old = self.world.versions[topic]
        partitions = max(1, old.partitions - 1) if kind == "recreate_fewer" else old.partitions + 1
        self.producer.pause(topic)
        self.delete(topic)
        if kind == "recreate_late":
            time.sleep(POLICY.session_timeout_s * 1.5)  # missing for longer than a session timeout: parked
        self.create(topic, partitions)
        self.producer.resume(topic)
        return f"{kind} {topic}: {old.partitions} -> {partitions} partitions"

    def add_topic(self) -> str:
        if self.removed and self.rng.random() < 0.5:
            topic = self.removed.pop(0)
            if topic not in self.world.versions:
                self.create(topic, self.o.partitions)
        else:
            topic = self.new_topic()
        if topic in self.off_list:
            began, _ = self.off_list[topic][-1]
            self.off_list[topic][-1] = (began, time.time())
        self.set_lists([*self.listed, topic])
        return f"add_topic {topic}"

    def remove_topic(self) -> str:
        if len(self.listed) < 2:
            return self.add_topic() + " (instead of remove_topic: one topic left)"
        topic = self.rng.choice(self.listed)
        self.removed.append(topic)
        self.off_list.setdefault(topic, []).append((time.time(), None))
        self.set_lists([t for t in self.listed if t != topic])
        return f"remove_topic {topic}"

    def delete_records(self) -> str:
        """DeleteRecords on the partition of the listed topics that holds the most, up to its end half of the time
        (records the group may not have read yet: a ``data_loss`` event must name them), else part of the way."""
        topics = [t for t in self.listed if t in self.world.versions]
        backend = KafkaBackend(KafkaStreamConfig(bootstrap_servers=self.world.bootstrap, topics=topics))
        marks = backend.watermarks(backend.listing().shards)
        backend.close()
        shard, mark = max(marks.items(), key=lambda item: item[1].high - item[1].low)
        before = mark.high if self.rng.random() < 0.5 else self.rng.randint(mark.low, mark.high)
        topic, partition = parse_shard(shard)
        for future in self.admin.delete_records([TopicPartition(topic, partition, before)]).values():
            future.result()
        return f"delete_records {shard} below {before} (log was [{mark.low}, {mark.high}))"

    def kafka_tool_reset(self) -> str:
        topic = self.rng.choice([t for t in self.listed if t in self.world.versions])
        how = self.rng.choice([["--to-earliest"], ["--to-latest"], ["--to-offset", "0"]])
        since = time.time()
        command = [
            java_binary(), "-Xmx128m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-cp", f"{kafka_libs()}/*",
            "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand", "--bootstrap-server", self.world.bootstrap,
            "--group", self.world.group, "--reset-offsets", "--topic", topic, *how, "--execute",
        ]  # fmt: skip
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"kafka-consumer-groups failed: {done.stderr[-500:]}")
        backend = KafkaBackend(KafkaStreamConfig(bootstrap_servers=self.world.bootstrap, topics=[topic]))
        shards = [f"{topic}:{p}" for p in range(self.world.versions[topic].partitions)]

        def restored() -> bool:
            found = backend.group_offsets(self.world.group, shards)
            return all(m is None or m.ours for m in found.values())

        ok = _until(restored, 90, 0.5)
        backend.close()
        with self.world.lock:
            refused = any(
                e.kind == "reset_refused" and e.at >= since and (e.shard or "").startswith(f"{topic}:")
                for e in self.world.events
            )
        outcome = "refused" if ok and refused else "restored_silently" if ok else "unrefused"
        self.tool_resets[outcome] += 1
        return f"kafka_tool_reset {topic} {' '.join(how)}: {outcome}"

    def state_wipe(self) -> str:
        with self.world.commits.exclusive():
            self.world.stores += 1
            self.world.store = SqlStateStore(f"sqlite:///{self.world.work / f'state-{self.world.stores}.db'}")
        return f"state_wipe (store {self.world.stores})"

    def operate(self, kind: str) -> None:
        done: str = self.recreate(kind) if kind.startswith("recreate") else getattr(self, kind)()
        self.operations[kind] += 1
        self.op_log.append(f"{time.time():.1f} {done}")

    # -- the run ------------------------------------------------------------------------------------------------

    def drained(self) -> bool:
        state, _ = self.world.store.load(self.member_key())
        if state is None:
            return False
        backend = KafkaBackend(KafkaStreamConfig(bootstrap_servers=self.world.bootstrap, topics=self.listed))
        try:
            listing = backend.listing()
            marks = backend.watermarks(listing.shards)
        except StreamError:
            return False
        finally:
            backend.close()
        return all(
            s in state.shards and state.shards[s].committed == m.high and state.shards[s].parked is None
            for s, m in marks.items()
        )

    def close(self) -> None:
        for member in self.members:
            member.stop.set()
        for member in self.members:
            member.thread.join(10)
        self.producer.producer.flush(10)

    def member_key(self) -> str:
        return self.members[0].member().key

    def run(self) -> dict[str, Any]:
        o = self.o
        started = time.monotonic()
        for _ in range(o.topics):
            self.listed.append(self.new_topic())
        self.members = [Member(self.world, f"m{i}", self.listed) for i in range(o.members)]
        for member in self.members:
            member.thread.start()
        self.producer.thread.start()
        kinds = plan(o.operations, o.seed)
        producing_s = o.records / o.rate
        gap = producing_s / (len(kinds) + 1)
        for kind in kinds:
            time.sleep(self.rng.uniform(0.5 * gap, 1.5 * gap))
            try:
                self.operate(kind)
            except Exception as exc:  # an operation that could not be done is an error of the run
                self.world.errors.append(f"{kind}: {type(exc).__name__}: {exc}")
        self.producer.done.wait(max(0.0, o.timeout_s - (time.monotonic() - started)))
        produced_at = time.monotonic()
        drained = _until(self.drained, max(0.0, o.timeout_s - (time.monotonic() - started)), 1.0)
        drain_s = time.monotonic() - produced_at
        for member in self.members:
            member.stop.set()
        for member in self.members:
            member.thread.join(10)
        errors = list(self.world.errors)
        if not self.producer.done.is_set():
            errors.append("the producer did not finish in time")
        if not drained:
            errors.append("the backlog did not drain in time")
        if self.tool_resets["unrefused"]:
            errors.append(f"{self.tool_resets['unrefused']} reset(s) made with Kafka's tool not refused")
        with self.world.lock:
            evidence = Evidence(
                versions=list(self.world.all_versions),
                acked={k: dict(v) for k, v in self.world.acked.items()},
                reads=list(self.world.reads),
                events=list(self.world.events),
                final_topics=set(self.listed),
                off_list={t: list(spans) for t, spans in self.off_list.items()},
            )
        verdict = check(evidence)
        extra = {
            "records": self.world.produced,
            "producer_failed": self.producer.failed,
            "operations": sum(self.operations.values()),
            "operations_by_kind": dict(sorted(self.operations.items())),
            "topic_versions": len(self.world.all_versions),
            "members": o.members,
            "seed": o.seed,
            "tool_resets": dict(sorted(self.tool_resets.items())),
            "runs": dict(sorted(self.world.runs.items())),
            "tick_errors": dict(sorted(self.world.tick_errors.items())),
            "events": dict(sorted(Counter(e.kind for e in evidence.events).items())),
            "drain_s": round(drain_s, 1),
            "duration_s": round(time.monotonic() - started, 1),
            "operations_log": self.op_log,
        }
        return summary(verdict, extra, errors)


def run_lifecycle(options: Options) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="streamgroup-lifecycle-") as tmp, running_broker() as broker:
        driver = Driver(options, broker.bootstrap, Path(tmp))
        try:
            return driver.run()
        finally:
            # Clients still alive when the broker stops would log refused connections until the process ends.
            driver.close()
            del driver
            gc.collect()


def parse(argv: list[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(prog="python -m bench.lifecycle", description=__doc__.splitlines()[0])
    d = Options()
    parser.add_argument("--records", type=int, default=d.records)
    parser.add_argument("--operations", type=int, default=d.operations)
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--topics", type=int, default=d.topics)
    parser.add_argument("--partitions", type=int, default=d.partitions)
    parser.add_argument("--members", type=int, default=d.members)
    parser.add_argument("--rate", type=float, default=d.rate, help="records per second")
    parser.add_argument("--timeout", type=float, default=d.timeout_s, help="seconds for the whole run")
    a = parser.parse_args(argv)
    return Options(a.records, a.operations, a.seed, a.topics, a.partitions, a.members, a.rate, a.timeout)


def main(argv: list[str] | None = None) -> int:
    """``--backend kafka`` (the default, this module) or ``--backend v3io`` (``bench.lifecycle.v3io``)."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--backend", choices=["kafka", "v3io"], default="kafka")
    chosen, rest = pre.parse_known_args(sys.argv[1:] if argv is None else argv)
    if chosen.backend == "v3io":
        from bench.lifecycle import v3io  # imports this module: loaded only when asked for

        return v3io.main(rest)
    result = run_lifecycle(parse(rest))
    print(json.dumps(result), flush=True)
    return 0 if result.get("passed") else 1


if __name__ == "__main__":
    sys.exit(main())
