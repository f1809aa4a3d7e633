"""``python -m bench.lifecycle --backend v3io``: a group drains a v3io stream while it lives its whole life.

``python -m bench.lifecycle --backend v3io [--records 50000] [--operations 10] [--seed 1] [--shards 3]
[--members 3] [--rate 1000] [--timeout 900] [--store sqlite|v3io|v3io-dir] [--kinds K,...]``

1. The project's local v3io server (``dagster_streamgroup.local.v3io``) of its own, one stream of ``--shards``
   shards, and a group of ``--members`` members (``GroupMember`` ticks over the v3io state store, each member a
   thread with its own store and backend, each run a thread that reads its ranges with the backend's
   ``read_range``, then commits through its member and mirrors the offsets into the shard attributes), with
   ``on_recreated="earliest"`` so the drain goes on by itself. A writer puts ``--records`` records at ``--rate``
   records/s round-robin over the shards, each record naming its stream version and shard; what counts as written
   is what ``PutRecords`` acknowledged with a sequence number.
2. While they drain, ``--operations`` lifecycle operations (seeded: every kind once, then at random):
   ``recreate_fewer`` / ``recreate_more`` (the stream deleted and created again at its path with one shard fewer /
   more), ``add_shards`` (one or two shards added to the live stream), ``state_delete_base`` /
   ``state_delete_head`` / ``state_delete_log`` (one item of the group's state deleted by hand, then the recovery
   docs/stores.md gives the operator: a refused state's items all deleted, so the group starts again from the
   offsets mirrored in the shard attributes), ``attribute_reset`` (Nuclio's way to replay a group: the shard's
   ``__<group>_committed_sequence_number`` set backwards or forwards, which must be refused with an event and the
   mirror restored).
3. Then the drain: until every shard of the stream has its committed offset at its end.
4. The check (``bench.lifecycle.check``): every record each stream version held is read exactly once by a
   committed run, or reported by an event naming it. The last line is one JSON object; ``passed`` is false, and the
   exit code 1, for anything lost, read twice, read from the wrong stream version, a state that went back after an
   item was deleted, a replay not refused, a backlog not drained, or an error of the driver.

A state item is deleted, and the replay set, between two commits (the driver holds the runs' commits meanwhile):
what a member re-reads when a state is lost between a commit and its mirror is documented ("ranges committed since
the last mirror run again") and not what this run measures.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import random
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
import v3io.dataplane

from bench.lifecycle.check import Event, Evidence, ReadRange, Version, check, payload, summary
from bench.lifecycle.run import POLICY, STALL_S, SharedLock, _until
from dagster_streamgroup import protocol
from dagster_streamgroup.local.v3io.testing import V3ioServerInfo, running_v3io_server
from dagster_streamgroup.member import ContentionError, GroupMember
from dagster_streamgroup.protocol import GroupState, Launch, StateFormatError
from dagster_streamgroup.stores.base import StateDamagedError, StateStore, StoreUnavailableError
from dagster_streamgroup.stores.sql import DEFAULT_TABLE, state_table
from dagster_streamgroup.stores.sql_log import LoggedSqlStateStore, log_table
from dagster_streamgroup.stores.v3io import DEFAULT_DIRECTORY, V3ioStateStore, state_location
from dagster_streamgroup.stores.v3io_log import parse_log_item
from dagster_streamgroup.streams.base import StreamError
from dagster_streamgroup.streams.v3io import V3ioBackend, committed_attribute, mirror_attribute
from dagster_streamgroup.streams.v3io_config import V3ioConnection, V3ioStreamConfig

KINDS = (
    "recreate_fewer",
    "recreate_more",
    "add_shards",
    "state_delete_base",
    "state_delete_head",
    "state_delete_log",
    "attribute_reset",
)
"""With ``--store v3io``; with ``--store sqlite`` (the product's default store) there is no head item to delete."""
SQLITE_KINDS = tuple(k for k in KINDS if k != "state_delete_head")
CONTAINER = "bigdata"
NEVER = v3io.dataplane.RaiseForStatus.never
BATCH = 200


@dataclass(frozen=True)
class Options:
    records: int = 50_000
    operations: int = 10
    seed: int = 1
    shards: int = 3
    members: int = 3
    rate: float = 1000.0
    timeout_s: float = 900.0
    store: str = "sqlite"
    """Where the group state lives: ``sqlite`` (a file of the run's), ``v3io`` (items beside the shards, deleted with
    the stream) or ``v3io-dir`` (items in a directory of the store's own, ``v3io://HOST/CONTAINER/streamgroup``)."""
    only: tuple[str, ...] = ()
    """The kinds of operation to draw from (all of the store's when empty)."""

    @property
    def kinds(self) -> tuple[str, ...]:
        of_store = SQLITE_KINDS if self.store == "sqlite" else KINDS
        return tuple(k for k in of_store if k in self.only) if self.only else of_store


def plan(operations: int, seed: int, kinds_of_store: Sequence[str] = KINDS) -> list[str]:
    """Every kind once (shuffled), then kinds at random: the same list for the same seed."""
    rng = random.Random(seed)
    kinds = list(kinds_of_store)
    rng.shuffle(kinds)
    while len(kinds) < operations:
        kinds.append(rng.choice(kinds_of_store))
    return kinds[: max(operations, 0)]


@dataclass
class World:
    """Everything the driver knows and records, shared by its threads."""

    server: V3ioServerInfo
    path: str
    group: str
    store_kind: str
    work: Path
    lock: threading.Lock = field(default_factory=threading.Lock)
    commits: SharedLock = field(default_factory=SharedLock)
    current: Version | None = None
    """The stream version at the path (None while it is deleted)."""
    all_versions: list[Version] = field(default_factory=list)
    identities: dict[str, tuple[str, int]] = field(default_factory=dict)
    """Each shard log's identity -> the stream version it belongs to."""
    acked: dict[tuple[str, int, int], dict[int, bytes]] = field(default_factory=dict)
    reads: list[ReadRange] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    runs: Counter[str] = field(default_factory=Counter)
    tick_errors: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    produced: int = 0

    def config(self) -> V3ioStreamConfig:
        return V3ioStreamConfig(
            endpoint=self.server.endpoint,
            container=CONTAINER,
            stream_path=self.path,
            access_key=self.server.access_key,
        )

    def backend(self) -> V3ioBackend:
        return V3ioBackend(self.config(), stall_timeout_s=STALL_S)

    def sqlite_url(self) -> str:
        return f"sqlite:///{self.work / 'state.db'}"

    def store(self) -> StateStore:
        if self.store_kind == "sqlite":
            return LoggedSqlStateStore(self.sqlite_url())
        connection = V3ioConnection(
            endpoint=self.server.endpoint, container=CONTAINER, access_key=self.server.access_key
        )
        return V3ioStateStore(connection, beside_streams=self.store_kind == "v3io")

    def record_events(self, events: Sequence[protocol.GroupEvent]) -> None:
        with self.lock:
            self.events += [Event(e.kind.value, e.shard, e.start, e.end, e.detail, e.at) for e in events]


class Member:
    """One group member: a thread that ticks once per heartbeat and starts a thread per run it must launch."""

    def __init__(self, world: World, member_id: str) -> None:
        self.world = world
        self.member_id = member_id
        self.backend = world.backend()
        self.store = world.store()
        self.started: set[str] = set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, name=f"member-{member_id}", daemon=True)

    def member(self, backend: V3ioBackend | None = None) -> GroupMember:
        return GroupMember(self.store, backend or self.backend, self.world.group, self.member_id, POLICY)

    def loop(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                report = self.member().tick()
            except Exception as exc:  # a tick that fails waits for the next, as a member sensor's does
                self.world.tick_errors[type(exc).__name__] += 1
                if not isinstance(exc, StreamError | ContentionError | StateFormatError | StoreUnavailableError):
                    self.world.errors.append(f"tick of {self.member_id}: {type(exc).__name__}: {exc}")
                self.stop.wait(POLICY.heartbeat_interval_s)
                continue
            self.world.record_events(report.new_events)
            for run_key, launches in protocol.runs_of(report.to_request).items():
                if run_key in self.started:
                    continue
                self.started.add(run_key)
                threading.Thread(target=self.guarded_run, args=(launches,), daemon=True).start()
            self.stop.wait(max(0.0, POLICY.heartbeat_interval_s - (time.monotonic() - started)))
        self.backend.close()

    def guarded_run(self, launches: list[Launch]) -> None:
        backend = self.world.backend()
        try:
            self.run(backend, launches)
        except Exception as exc:
            self.world.errors.append(f"run {launches[0].run_key}: {type(exc).__name__}: {exc}")
        finally:
            backend.close()

    def run(self, backend: V3ioBackend, launches: list[Launch]) -> None:
        """What a run does: read its ranges exactly, commit them (fenced), mirror the offsets."""
        world = self.world
        reports = [protocol.report_of(x) for x in launches]
        records: dict[str, list[tuple[int, bytes]]] = {x.shard: [] for x in launches}
        read_in = world.current
        try:
            for x in launches:
                for batch in backend.read_range(x.shard, x.start, x.end):
                    for row in batch.select(["sequence_number", "data"]).to_pylist():
                        records[x.shard].append((int(row["sequence_number"]), bytes(row["data"])))
        except StreamError as exc:
            world.runs["read_failed"] += 1
            self._fail(backend, reports, f"{type(exc).__name__}: {exc}")
            return
        with world.commits.shared():
            member = self.member(backend)
            try:
                outcome, stats = member.commit_run_state_only(reports)
            except (StreamError, ContentionError, StateFormatError, StoreUnavailableError) as exc:
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
                except StreamError:
                    # The state holds the commit; a member's next tick brings the mirror to it (``_mirror_upkeep``).
                    world.runs["mirror_failed"] += 1
        world.runs["committed"] += 1
        state = stats.state
        committed_in = world.current
        with world.lock:
            for x in launches:
                if x.shard in fresh:
                    identity = state.shards[x.shard].identity if state is not None else None
                    if identity is None and read_in is not None and committed_in is not None:
                        # A shard positioned while empty has no identity until its next tick: the range is placed in
                        # the stream version that was at the path all along (the payloads must then name it).
                        world.runs["committed_without_identity"] += 1
                        if read_in.number == committed_in.number:
                            identity = read_in.topic_id
                    world.reads.append(ReadRange(x.shard, identity, x.start, x.end, tuple(records[x.shard])))

    def _fail(self, backend: V3ioBackend, reports: list[protocol.RangeReport], reason: str) -> None:
        """The run ended failed: reported as the member sensor reports a failed run (its ranges retried)."""
        with contextlib.suppress(StreamError, ContentionError, StateFormatError, StoreUnavailableError):
            self.member(backend).fail_run(reports, reason[:300])


class RecordWriter:
    """Puts records round-robin over the shards of the stream version at the path, each naming its version and
    shard; what counts is what ``PutRecords`` acknowledged. Each shard's log identity is learnt as soon as the
    shard holds a record (the marker is written once, by whoever reads it first)."""

    def __init__(self, world: World, total: int, rate: float) -> None:
        self.world = world
        self.total = total
        self.rate = rate
        self.client = v3io.dataplane.Client(**world.server.client_kwargs(), max_connections=2)
        self.backend = world.backend()
        self.named: dict[str, tuple[str, int]] = {}
        """Shard -> the version it was identified in (cleared when the stream is created again)."""
        self.seq = 0
        self.failed = 0
        self.paused = False
        self.reserve = min(total // 10, 1000)
        """Records kept for after the last operation, so the last stream version holds records in every shard (a
        version with none is told by its offsets only, after a session timeout: not what this run measures)."""
        self.operations_done = threading.Event()
        self.done = threading.Event()
        self.batch = threading.Lock()
        """Held while a batch is put: ``pause`` waits for it, so nothing is written after."""
        self.thread = threading.Thread(target=self.loop, name="writer", daemon=True)

    def loop(self) -> None:
        try:
            started = time.monotonic()
            while self.seq < self.total:
                due = int((time.monotonic() - started) * self.rate)
                if self.seq >= self.total - self.reserve and not self.operations_done.is_set():
                    due = self.seq
                if self.seq >= due:
                    time.sleep(0.01)
                    continue
                with self.batch:
                    self._batch(min(BATCH, due - self.seq, self.total - self.seq))
        except Exception as exc:
            self.world.errors.append(f"writer: {type(exc).__name__}: {exc}")
        finally:
            self.done.set()

    def _batch(self, size: int) -> None:
        version = self.world.current
        if self.paused or version is None:
            time.sleep(0.01)
            return
        shards = [(self.seq + i) % version.partitions for i in range(size)]
        values = [payload(version.topic, version.number, s, self.seq + i) for i, s in enumerate(shards)]
        response = self.client.stream.put_records(
            CONTAINER,
            self.world.path,
            [{"shard_id": s, "data": v} for s, v in zip(shards, values, strict=True)],
            raise_for_status=NEVER,
        )
        if response.status_code != 200:
            time.sleep(0.1)
            return
        with self.world.lock:
            for shard, value, result in zip(shards, values, response.output.records, strict=True):
                if result.error_code or result.sequence_number is None:
                    self.failed += 1
                    continue
                key = (version.topic, version.number, shard)
                self.world.acked.setdefault(key, {})[int(result.sequence_number)] = value
                self.world.produced += 1
        self.seq += size
        self.identify(version)

    def identify(self, version: Version) -> None:
        """Learn the identities of the version's shards that hold records and are not known yet."""
        with self.world.lock:
            known = {s for (t, n, s) in self.world.acked if (t, n) == (version.topic, version.number)}
            named = {int(shard) for shard, owner in self.named.items() if owner == (version.topic, version.number)}
        todo = sorted(known - named)
        if not todo:
            return
        found = self.backend.identities([str(s) for s in todo])
        with self.world.lock:
            for shard, identity in found.items():
                self.world.identities[identity] = (version.topic, version.number)
                self.named[shard] = (version.topic, version.number)

    def pause(self) -> None:
        """Stop writing and wait for the batch being put; the stream's identities are all learnt."""
        self.paused = True
        with self.batch:
            if self.world.current is not None:
                self.identify(self.world.current)

    def resume(self) -> None:
        self.named = {}
        self.paused = False

    def close(self) -> None:
        self.backend.close()
        self.client.close()


class Driver:
    def __init__(self, options: Options, server: V3ioServerInfo, work: Path) -> None:
        self.o = options
        self.rng = random.Random(options.seed)
        run = uuid.uuid4().hex[:8]
        self.world = World(server, f"lifecycle_{run}", f"lc_{run}", options.store, work)
        self.engine = sa.create_engine(self.world.sqlite_url()) if options.store == "sqlite" else None
        self.client = v3io.dataplane.Client(**server.client_kwargs(), max_connections=2)
        self.members: list[Member] = []
        self.writer = RecordWriter(self.world, options.records, options.rate)
        self.operations: Counter[str] = Counter()
        self.outcomes: dict[str, Counter[str]] = {"state_delete": Counter(), "attribute_reset": Counter()}
        self.op_log: list[str] = []

    # -- the stream ---------------------------------------------------------------------------------------------

    def create(self, shards: int) -> Version:
        self.client.stream.create(CONTAINER, self.world.path, shard_count=shards)
        return self.register(shards)

    def register(self, shards: int) -> Version:
        """A stream version created at the path now."""
        with self.world.lock:
            number = len(self.world.all_versions)
            version = Version(self.world.path, number, f"{self.world.path}#{number}", shards, time.time())
            self.world.current = version
            self.world.all_versions.append(version)
        return version

    def recreate(self, kind: str) -> str:
        old = self.world.current
        assert old is not None
        shards = max(1, old.partitions - 1) if kind == "recreate_fewer" else old.partitions + 1
        self.writer.pause()
        with self.world.lock:
            self.world.current = None
        for attempt in range(10):
            # The client deletes a stream as the platform lets it: each item of its directory, then the directory.
            # A member writing into it meanwhile (a mirror, a log marker) leaves the directory behind: again.
            self.client.stream.delete(CONTAINER, self.world.path, raise_for_status=NEVER)
            response = self.client.stream.create(CONTAINER, self.world.path, shard_count=shards, raise_for_status=NEVER)
            if 200 <= response.status_code < 300:
                break
            if response.status_code != 409 or attempt == 9:
                raise RuntimeError(f"creating the stream again: {response.status_code} {response.body!r}")
            time.sleep(0.2)
        self.register(shards)
        self.writer.resume()
        return f"{kind}: {old.partitions} -> {shards} shards"

    def add_shards(self) -> str:
        old = self.world.current
        assert old is not None
        shards = old.partitions + self.rng.choice([1, 2])
        self.client.stream.update(CONTAINER, self.world.path, shard_count=shards)
        grown = dataclasses.replace(old, partitions=shards)
        with self.world.lock:
            self.world.current = grown
            self.world.all_versions[old.number] = grown
        return f"add_shards: {old.partitions} -> {shards} shards"

    # -- the state ----------------------------------------------------------------------------------------------

    def key(self) -> str:
        return self.members[0].member().key

    def state_items(self) -> dict[str, str]:
        """The group state's stored things: name -> ``base`` / ``head`` / ``log`` (SQLite: the newest log row is
        ``newest``, never deleted here: the store keeps no other record of its newest write, docs/stores.md)."""
        key = self.key()
        if self.engine is not None:
            base, log = state_table(DEFAULT_TABLE), log_table(f"{DEFAULT_TABLE}_log")
            with self.engine.connect() as conn:
                has_base = conn.execute(sa.select(base.c.key).where(base.c.key == key)).first() is not None
                versions = sorted(conn.execute(sa.select(log.c.version).where(log.c.key == key)).scalars())
            found = {"base": "base"} if has_base else {}
            found.update({f"log {v}": "newest" if v == versions[-1] else "log" for v in versions})
            return found
        _container, directory, item = state_location(key, CONTAINER, DEFAULT_DIRECTORY, self.world.store_kind == "v3io")
        cursor = self.client.kv.new_cursor(CONTAINER, directory + "/", attribute_names=["__name"])
        names = [str(i["__name"]) for i in cursor.all() if str(i["__name"]).startswith(item)]
        kinds: dict[str, str] = {}
        for name in names:
            parsed = parse_log_item(item, name)
            kinds[name] = "base" if name == item else "head" if parsed is not None and parsed.is_head else "log"
        return kinds

    def delete_item(self, name: str) -> None:
        key = self.key()
        if self.engine is not None:
            base, log = state_table(DEFAULT_TABLE), log_table(f"{DEFAULT_TABLE}_log")
            with self.engine.begin() as conn:
                if name == "base":
                    conn.execute(sa.delete(base).where(base.c.key == key))
                else:
                    version = int(name.split()[1])
                    conn.execute(sa.delete(log).where((log.c.key == key) & (log.c.version == version)))
            return
        _container, directory, _item = state_location(
            key, CONTAINER, DEFAULT_DIRECTORY, self.world.store_kind == "v3io"
        )
        self.client.kv.delete(CONTAINER, directory, name, raise_for_status=NEVER)

    def load(self) -> GroupState | None:
        store = self.world.store()
        try:
            return store.load(self.key())[0]
        finally:
            store.close()

    def state_delete(self, kind: str) -> str:
        """One item of the state deleted by hand, what a member sees, then the operator's documented recovery."""
        which = kind.removeprefix("state_delete_")
        with self.world.commits.exclusive():
            before = self.load()
            victim = None
            for _ in range(20):
                kinds = self.state_items()
                candidates = sorted((name for name, k in kinds.items() if k == which), key=_item_order)
                if candidates:
                    victim = candidates[-1]  # of the log items, the newest one the store can tell is missing
                    break
                time.sleep(0.25)
            if victim is None:
                raise RuntimeError(f"the state holds no {which} item to delete")
            self.delete_item(victim)
            damaged_before = self.world.tick_errors["StateDamagedError"]
            try:
                after = self.load()
                outcome = "lost" if after is None else self._compare(before, after)
            except StateDamagedError:
                outcome = "refused"
            if outcome == "refused":
                _until(lambda: self.world.tick_errors["StateDamagedError"] > damaged_before, 10.0, 0.2)
                seen = self.world.tick_errors["StateDamagedError"] - damaged_before
                # docs/stores.md: "delete the state's items ... the group then starts again from the offsets
                # mirrored in the stream's shard attributes".
                # (logs first: a base row deleted alone would be a lost state with log rows left over)
                for name in sorted(self.state_items(), key=lambda n: n == "base"):
                    self.delete_item(name)
                detail = f"{seen} member tick(s) refused it, then every item of the state deleted"
            else:
                detail = "no recovery needed" if outcome == "lost" else "read on"
            if outcome in ("refused", "lost") and not _until(self.rebuilt, 60.0, 0.25):
                raise RuntimeError(f"after {kind}, the group did not start again within 60 s")
        self.outcomes["state_delete"][f"{which}_{outcome}"] += 1
        return f"{kind} {victim}: {outcome} ({detail})"

    def rebuilt(self) -> bool:
        """The group runs again: a state positions every shard of the stream. Until then the offsets mirrored in
        the stream are all that is left of the group's progress, and a stream deleted meanwhile takes them along:
        the records its old version held unread are then named by nothing (docs/reliability.md)."""
        version = self.world.current
        try:
            state = self.load()
        except (StateFormatError, StoreUnavailableError):
            return False
        return (
            state is not None
            and version is not None
            and all(state.shards.get(str(s)) and state.shards[str(s)].committed for s in range(version.partitions))
        )

    @staticmethod
    def _compare(before: GroupState | None, after: GroupState) -> str:
        """``rolled_back`` when a shard's committed offset went down (a store read an older state as the newest)."""
        for shard, was in (before.shards if before is not None else {}).items():
            now = after.shards.get(shard)
            went_down = now is None or now.committed is None or now.committed < (was.committed or 0)
            if was.committed is not None and went_down and (now is None or now.identity == was.identity):
                return "rolled_back"
        return "read_whole"

    def attribute_reset(self) -> str:
        """Nuclio's replay: ``__<group>_committed_sequence_number`` set on a shard, backwards or forwards (tried
        again while no shard is idle and mirrored: the commits are held only while one is)."""
        for _ in range(40):
            done = self._attribute_reset()
            if done is not None:
                return done
            time.sleep(0.5)
        raise RuntimeError("no shard was idle and mirrored in 20 s")

    def _attribute_reset(self) -> str | None:
        backend = self.world.backend()
        try:
            with self.world.commits.exclusive():
                version = self.world.current
                assert version is not None
                state = self.load()
                if state is None:
                    return None
                idle = {
                    sid
                    for sid, shard in state.shards.items()
                    if shard.inflight is None
                    and shard.parked is None
                    and shard.committed is not None
                    and shard.owner is not None
                    and shard.owner in state.members
                }
                shards = [str(s) for s in range(version.partitions) if str(s) in idle]
                # A shard with a range in flight is left alone: its run waits for the commits this operation holds,
                # and a member looks at a shard's record in the stream only when nothing is in flight on it.
                mirrored = {
                    s: o
                    for s, o in backend.committed(self.world.group, shards).items()
                    if o is not None and o == state.shards[s].committed
                }
                marks = backend.watermarks(list(mirrored))
                choices = [s for s, o in mirrored.items() if o > 1 or marks[s].high > o]
                if not choices:
                    return None
                shard = self.rng.choice(sorted(choices))
                at = mirrored[shard]
                backwards = at > 1 and (marks[shard].high <= at or self.rng.random() < 0.5)
                target = self.rng.randint(1, at - 1) if backwards else self.rng.randint(at + 1, marks[shard].high)
                since = time.time()
                self.client.kv.update(
                    CONTAINER, self.world.path, shard, attributes={committed_attribute(self.world.group): target - 1}
                )

                def refused() -> bool:
                    with self.world.lock:
                        events = self.world.events
                        return any(e.kind == "reset_refused" and e.at >= since and e.shard == shard for e in events)

                # Commits held for three heartbeats: the owner's next tick sees the replay before a commit's mirror
                # can. Not longer: a tick that read the shard's attribute just before the write may launch a range
                # on it, and that range's commit must not wait for this operation.
                seen = _until(refused, 3 * POLICY.heartbeat_interval_s, 0.1)
            seen = seen or _until(refused, 30.0, 0.2)
            back = _until(lambda: self._mirrored_by_members(shard), 10.0, 0.2)
        finally:
            backend.close()
        outcome = "refused" if seen and back else "restored_silently" if back else "unrefused"
        self.outcomes["attribute_reset"][outcome] += 1
        return f"attribute_reset shard {shard}: {at} -> {target} ({'back' if backwards else 'forward'}): {outcome}"

    def _mirrored_by_members(self, shard: str) -> bool:
        """The shard's committed-sequence attribute is the members' again (it equals their mirror marker)."""
        names = [committed_attribute(self.world.group), mirror_attribute(self.world.group)]
        item = self.client.kv.get(CONTAINER, self.world.path, shard, attribute_names=names, raise_for_status=NEVER)
        if item.status_code != 200:
            return False
        found = item.output.item
        return names[0] in found and found.get(names[0]) == found.get(names[1])

    def operate(self, kind: str) -> None:
        if kind.startswith("recreate"):
            done = self.recreate(kind)
        elif kind.startswith("state_delete"):
            done = self.state_delete(kind)
        else:
            done = getattr(self, kind)()
        self.operations[kind] += 1
        self.op_log.append(f"{time.time():.1f} {done}")

    # -- the run ------------------------------------------------------------------------------------------------

    def drained(self) -> bool:
        version = self.world.current
        try:
            state = self.load()
        except (StateFormatError, StoreUnavailableError):
            return False
        if state is None or version is None:
            return False
        backend = self.world.backend()
        try:
            marks = backend.watermarks([str(s) for s in range(version.partitions)])
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
        self.writer.close()
        self.client.close()
        if self.engine is not None:
            self.engine.dispose()

    def run(self) -> dict[str, Any]:
        o = self.o
        started = time.monotonic()
        self.create(o.shards)
        self.members = [Member(self.world, f"m{i}") for i in range(o.members)]
        for member in self.members:
            member.thread.start()
        self.writer.thread.start()
        kinds = plan(o.operations, o.seed, o.kinds)
        gap = (o.records / o.rate) / (len(kinds) + 1)
        for kind in kinds:
            time.sleep(self.rng.uniform(0.5 * gap, 1.5 * gap))
            try:
                self.operate(kind)
            except Exception as exc:  # an operation that could not be done is an error of the run
                self.world.errors.append(f"{kind}: {type(exc).__name__}: {exc}")
        self.writer.operations_done.set()
        self.writer.done.wait(max(0.0, o.timeout_s - (time.monotonic() - started)))
        produced_at = time.monotonic()
        drained = _until(self.drained, max(0.0, o.timeout_s - (time.monotonic() - started)), 1.0)
        drain_s = time.monotonic() - produced_at
        for member in self.members:
            member.stop.set()
        for member in self.members:
            member.thread.join(10)
        if self.world.current is not None:
            self.writer.identify(self.world.current)
        errors = list(self.world.errors)
        if not self.writer.done.is_set():
            errors.append("the writer did not finish in time")
        if not drained:
            errors.append("the backlog did not drain in time")
        resets = self.outcomes["attribute_reset"]
        if resets["unrefused"]:
            errors.append(f"{resets['unrefused']} replay(s) set on the committed attribute not refused")
        deletes = self.outcomes["state_delete"]
        for outcome, count in deletes.items():
            if outcome.endswith("_rolled_back"):
                errors.append(f"{count} state(s) read back to an older version after an item was deleted ({outcome})")
        with self.world.lock:
            evidence = Evidence(
                versions=list(self.world.all_versions),
                acked={k: dict(v) for k, v in self.world.acked.items()},
                reads=list(self.world.reads),
                events=list(self.world.events),
                final_topics={self.world.path},
                identities=dict(self.world.identities),
                stream=self.world.path,
            )
        verdict = check(evidence)
        extra = {
            "backend": "v3io",
            "records": self.world.produced,
            "writer_failed": self.writer.failed,
            "operations": sum(self.operations.values()),
            "operations_by_kind": dict(sorted(self.operations.items())),
            "stream_versions": len(self.world.all_versions),
            "members": o.members,
            "seed": o.seed,
            "store": o.store,
            "state_deletes": dict(sorted(deletes.items())),
            "attribute_resets": dict(sorted(resets.items())),
            "runs": dict(sorted(self.world.runs.items())),
            "tick_errors": dict(sorted(self.world.tick_errors.items())),
            "events": dict(sorted(Counter(e.kind for e in evidence.events).items())),
            "drain_s": round(drain_s, 1),
            "duration_s": round(time.monotonic() - started, 1),
            "operations_log": self.op_log,
        }
        return summary(verdict, extra, errors)


def _item_order(name: str) -> tuple[int, str]:
    """SQLite log rows by version (``log 9`` before ``log 10``), v3io items by name (their versions are padded)."""
    number = name.rsplit(maxsplit=1)[-1]
    return (int(number), "") if number.isdigit() else (0, name)


def run_lifecycle(options: Options) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(prefix="streamgroup-lifecycle-v3io-") as tmp,
        running_v3io_server(Path(tmp)) as server,
    ):
        driver = Driver(options, server, Path(tmp))
        try:
            return driver.run()
        finally:
            driver.close()


def parse(argv: list[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m bench.lifecycle --backend v3io", description=__doc__.splitlines()[0]
    )
    d = Options()
    parser.add_argument("--records", type=int, default=d.records)
    parser.add_argument("--operations", type=int, default=d.operations)
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--shards", type=int, default=d.shards)
    parser.add_argument("--members", type=int, default=d.members)
    parser.add_argument("--rate", type=float, default=d.rate, help="records per second")
    parser.add_argument("--timeout", type=float, default=d.timeout_s, help="seconds for the whole run")
    parser.add_argument(
        "--store", choices=["sqlite", "v3io", "v3io-dir"], default=d.store, help="where the group state lives"
    )
    parser.add_argument("--kinds", default="", help="comma-separated kinds of operation to draw from (default: all)")
    a = parser.parse_args(argv)
    only = tuple(k for k in a.kinds.split(",") if k)
    options = Options(a.records, a.operations, a.seed, a.shards, a.members, a.rate, a.timeout, a.store, only)
    unknown = sorted(set(only) - set(SQLITE_KINDS if a.store == "sqlite" else KINDS))
    if unknown:
        parser.error(f"--kinds: {', '.join(unknown)} not a kind of operation with --store {a.store}")
    return options


def main(argv: list[str] | None = None) -> int:
    result = run_lifecycle(parse(argv))
    print(json.dumps(result), flush=True)
    return 0 if result.get("passed") else 1
