"""A deterministic, seeded discrete-event simulation of a group: M members over N shards.

It drives the real protocol transitions through a simulated CAS store with read-to-write latency, so
concurrent ticks really conflict and retry with full-jitter backoff, and it injects the faults the group
must survive: crashes, pauses longer than the session timeout, explicit leaves, late joins, clock skew,
failing and vanishing runs, zombie runs that outlive their member, retention trimming, and (``lifecycle``) the
stream's own life: shards' logs recreated, parts of the stream missing for a while or taken off the members'
lists and put back, and operators resetting shards and unparking them. After every successful write it checks
the safety invariants (offsets move back only into a new log or by a reset, a new log is positioned at its
start, ranges of an old position never commit); at the end of a quiet period, the balance invariant.
The unit tests run it small; ``bench.convergence`` runs it at 200 members x 10,000 shards.
"""

from __future__ import annotations

import heapq
import itertools
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from dagster_streamgroup import protocol
from dagster_streamgroup.protocol import GroupPolicy, GroupState, Launch, RangeReport, Watermark, delta
from dagster_streamgroup.protocol.assignment import is_assignable

CasTransition = Callable[[GroupState, float], tuple[GroupState, Any]]


@dataclass
class SimConfig:
    members: int = 4
    shards: int = 16
    seed: int = 0
    policy: GroupPolicy = field(
        default_factory=lambda: GroupPolicy(heartbeat_interval_s=5, session_timeout_s=20, drain_timeout_s=15)
    )
    duration_s: float = 300.0
    quiet_s: float = 60.0
    """Fault-free time at the end, after which the group must be balanced."""
    tick_jitter: float = 0.1
    cas_latency_s: tuple[float, float] = (0.002, 0.03)
    cas_attempts: int = 6
    run_s: tuple[float, float] = (2.0, 12.0)
    produce_per_s: float = 50.0
    initial_backlog: int = 500
    retention_records: int | None = None
    p_run_fail: float = 0.0
    p_run_vanish: float = 0.0
    """A run that dies without reporting (killed worker): its member notices the run ended, as Dagster shows."""
    p_run_straggle: float = 0.0
    """A run that outlasts a session timeout plus the drain timeout (a paused run process, which says nothing
    while paused): if its member is evicted meanwhile, it becomes a zombie whose commit comes after its range
    was relaunched. Other runs say they are alive every heartbeat until they end (a vanishing run stops when it
    dies)."""
    faults: bool = False
    max_skew_s: float = 0.0
    cold_start: bool = True
    """All members start within the first tick interval (the herd); otherwise they join one by one."""
    crash_at_s: float | None = None
    """Crash one member at this time (the failover measurement)."""
    check_invariants: bool = True
    measure_deltas: bool = False
    """Encode every write as a ``StateDelta`` from the state before it, check it restores the state exactly, and
    keep its size next to the whole state's (what a store appending deltas would write)."""
    lifecycle: bool = False
    """Shards in two parts (``p0``, ``p1``), and the stream's life among the faults: logs recreated, a part missing
    or off every member's list for a while, operator resets, and operators unparking what was parked."""


@dataclass
class SimResult:
    config: SimConfig
    violations: list[str]
    ticks_to_balance: float | None
    ticks_to_failover: float | None
    max_tick_ms: float
    member_ticks: int
    cas_conflicts: int
    cas_giveups: int
    commits_accepted: int
    commits_refused: int
    runs: int
    balanced_at_end: bool
    final_state: GroupState
    tick_ms: list[float] = field(default_factory=list)
    delta_bytes: list[int] = field(default_factory=list)
    heartbeat_delta_bytes: list[int] = field(default_factory=list)
    """Sizes of deltas that only refresh one member's heartbeat."""
    state_bytes: list[int] = field(default_factory=list)

    @property
    def double_owner_violations(self) -> int:
        return sum(1 for v in self.violations if v.startswith("double-owner"))


@dataclass
class _Run:
    launches: list[Launch]
    """The run's ranges (one per shard), all under one run key."""
    ends_at: float
    outcome: str  # "ok" | "fail" | "vanish"
    done: bool = False

    @property
    def key(self) -> tuple[str, str, tuple[int, ...]]:
        """What the orchestrator deduplicates a request by: the run key, per member (Dagster scopes run keys
        to the sensor), with the epochs the launcher adds."""
        first = self.launches[0]
        return first.run_key, first.member_id, tuple(launch.epoch for launch in self.launches)

    @property
    def member_id(self) -> str:
        return self.launches[0].member_id


@dataclass
class _Member:
    member_id: str
    skew: float = 0.0
    crashed: bool = False
    paused_until: float = 0.0
    left: bool = False
    busy: bool = False


class Simulation:
    def __init__(self, config: SimConfig) -> None:
        self.cfg = config
        self.rng = random.Random(config.seed)
        self.now = 0.0
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self.state: GroupState = protocol.new_group("sim", "g", 0.0)
        self.version = 0
        if config.lifecycle:
            shard_ids = [f"p{i % 2}:{i:05d}" for i in range(config.shards)]
        else:
            shard_ids = [f"s{i:05d}" for i in range(config.shards)]
        self.shard_ids = shard_ids
        self.state = protocol.sync_shards(self.state, shard_ids, 0.0)
        self.incarnation: dict[str, int] = {}
        self.born: dict[str, float] = {}
        self.missing: set[str] = set()
        self.off_list: set[str] = set()
        self.members = {f"m{i:03d}": _Member(f"m{i:03d}") for i in range(config.members)}
        self.runs: dict[tuple[str, str, tuple[int, ...]], _Run] = {}
        self.active: dict[tuple[str, str, tuple[int, ...]], _Run] = {}
        """Runs that may still commit (not finished, not vanished): what the single-writer check looks at."""
        self.violations: list[str] = []
        self.coverage: dict[tuple[str, str | None, int], list[tuple[int, int, str]]] = {}
        """Committed advances per (shard, log identity, reset epoch): contiguous from the first position."""
        self.first_position: dict[tuple[str, str | None, int], int] = {}
        self.tick_ms: list[float] = []
        self.conflicts = 0
        self.giveups = 0
        self.accepted = 0
        self.refused = 0
        self.committed_by: set[tuple[str, str, str, int]] = set()
        """(shard, run key, member, epoch) of every accepted commit: who may be told ``already_committed``."""
        self.balanced_at: float | None = None
        self.crashed_member: str | None = None
        self.crash_time: float | None = None
        self.crash_shards: set[str] = set()
        self.failover_at: float | None = None
        self.delta_bytes: list[int] = []
        self.heartbeat_delta_bytes: list[int] = []
        self.state_bytes: list[int] = []

    # -- stream ---------------------------------------------------------------------------------

    def identity(self, shard: str) -> str | None:
        return f"{shard}#{self.incarnation.get(shard, 0)}" if self.cfg.lifecycle else None

    def watermark(self, shard: str, at: float) -> Watermark:
        born = self.born.get(shard)
        if born is None:
            high = self.cfg.initial_backlog + int(self.cfg.produce_per_s * at)
        else:  # a recreated log: its offsets count from its creation
            high = int(self.cfg.produce_per_s * (at - born))
        retention = self.cfg.retention_records
        low = 0 if retention is None else max(0, high - retention)
        return Watermark(low=low, high=high, identity=self.identity(shard))

    def view(self) -> protocol.StreamView | None:
        """What a member's backend lists now (``lifecycle`` only): every member lists the same parts."""
        if not self.cfg.lifecycle:
            return None
        return protocol.StreamView(
            shards=tuple(s for s in self.shard_ids if protocol.part_of(s) not in self.missing),
            parts=tuple(p for p in ("p0", "p1") if p not in self.off_list),
            identities={s: f"{s}#{self.incarnation.get(s, 0)}" for s in self.shard_ids},
            missing=frozenset(self.missing - self.off_list),
        )

    # -- scheduling -----------------------------------------------------------------------------

    def at(self, when: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._events, (when, next(self._seq), action))

    def run(self) -> SimResult:
        cfg = self.cfg
        period = cfg.policy.heartbeat_interval_s
        for i, member in enumerate(self.members.values()):
            if cfg.max_skew_s:
                member.skew = self.rng.uniform(-cfg.max_skew_s, cfg.max_skew_s)
            first = self.rng.uniform(0, period) if cfg.cold_start else i * period * 0.5 + self.rng.uniform(0, period)
            self.at(first, partial(self._tick, member))
        if cfg.faults:
            self._schedule_faults()
        if cfg.crash_at_s is not None:
            self.at(cfg.crash_at_s, self._crash_for_failover)
        end = cfg.duration_s + cfg.quiet_s
        while self._events and self._events[0][0] <= end:
            when, _, action = heapq.heappop(self._events)
            self.now = when
            action()
        balanced = self._balanced(self.state) if any(self._alive(m) for m in self.members.values()) else True
        if not balanced:
            self.violations.append(f"unbalanced after quiet period: {self._ownership_counts(self.state)}")
        self._check_coverage()
        return SimResult(
            config=cfg,
            violations=self.violations,
            ticks_to_balance=None if self.balanced_at is None else self.balanced_at / period,
            ticks_to_failover=(
                None
                if self.failover_at is None or self.crash_time is None
                else (self.failover_at - self.crash_time) / period
            ),
            max_tick_ms=max(self.tick_ms, default=0.0),
            member_ticks=len(self.tick_ms),
            cas_conflicts=self.conflicts,
            cas_giveups=self.giveups,
            commits_accepted=self.accepted,
            commits_refused=self.refused,
            runs=len(self.runs),
            balanced_at_end=balanced,
            final_state=self.state,
            tick_ms=self.tick_ms,
            delta_bytes=self.delta_bytes,
            heartbeat_delta_bytes=self.heartbeat_delta_bytes,
            state_bytes=self.state_bytes,
        )

    # -- faults ---------------------------------------------------------------------------------

    def _schedule_faults(self) -> None:
        cfg = self.cfg
        horizon = cfg.duration_s
        timeout = cfg.policy.session_timeout_s
        ids = list(self.members)
        for _ in range(self.rng.randint(1, max(1, len(ids)))):
            member = self.members[self.rng.choice(ids)]
            kind = self.rng.choice(["crash", "pause", "pause", "leave", "rejoin"])
            when = self.rng.uniform(0, horizon * 0.8)
            if kind == "crash" and sum(1 for m in self.members.values() if not m.crashed) > 1:
                self.at(when, partial(setattr, member, "crashed", True))
            elif kind == "pause":
                length = self.rng.uniform(timeout * 0.5, timeout * 3)
                self.at(when, partial(self._pause, member, length))
            elif kind == "leave":
                self.at(when, partial(self._leave, member))
        for i in range(self.rng.randint(0, 2)):
            late = _Member(f"late{i}")
            self.members[late.member_id] = late
            self.at(self.rng.uniform(0, horizon * 0.8), partial(self._tick, late))
        if cfg.lifecycle:
            self._schedule_lifecycle(horizon)

    def _schedule_lifecycle(self, horizon: float) -> None:
        """The stream's life: logs recreated, a part missing or off the list for a while, resets, and an operator
        who unparks what is parked (so the quiet period can converge)."""
        timeout = self.cfg.policy.session_timeout_s
        for _ in range(self.rng.randint(1, 4)):
            shard = self.rng.choice(self.shard_ids)
            self.at(self.rng.uniform(0, horizon * 0.8), partial(self._recreate, shard))
        for _ in range(self.rng.randint(0, 2)):
            part, kind = self.rng.choice(["p0", "p1"]), self.rng.choice([self.missing, self.off_list])
            start = self.rng.uniform(0, horizon * 0.7)
            self.at(start, partial(kind.add, part))
            self.at(start + self.rng.uniform(timeout * 0.2, timeout * 3), partial(kind.discard, part))
        for _ in range(self.rng.randint(0, 3)):
            self.at(self.rng.uniform(0, horizon * 0.8), self._operator_reset)
        every = max(timeout, 10.0)
        for i in range(int(horizon / every) + 2):
            self.at(i * every + every / 2, self._operator_unpark)

    def _recreate(self, shard: str) -> None:
        self.incarnation[shard] = self.incarnation.get(shard, 0) + 1
        self.born[shard] = self.now

    def _operator_reset(self) -> None:
        shard = self.rng.choice(self.shard_ids)
        if protocol.part_of(shard) in self.missing:
            return
        mark = self.watermark(shard, self.now)
        target = self.rng.randint(mark.low, max(mark.low, mark.high))
        identity = self.identity(shard)

        def transition(state: GroupState, now: float) -> tuple[GroupState, None]:
            return protocol.reset(state, {shard: target}, now, {shard: identity} if identity else None), None

        self._cas(transition, now_of=lambda: self.now, done=lambda _r: None)

    def _operator_unpark(self) -> None:
        """Resume every parked shard whose cause is gone (a park that cannot resume yet is left)."""

        def transition(state: GroupState, now: float) -> tuple[GroupState, None]:
            for shard_id, shard in state.shards.items():
                if shard.parked is not None and protocol.part_of(shard_id) not in self.missing:
                    state = protocol.unpark(state, shard_id, now)
            return state, None

        self._cas(transition, now_of=lambda: self.now, done=lambda _r: None)

    def _pause(self, member: _Member, length: float) -> None:
        member.paused_until = self.now + length

    def _leave(self, member: _Member) -> None:
        if member.crashed:
            return

        def transition(state: GroupState, now: float) -> tuple[GroupState, None]:
            return protocol.leave(state, member.member_id, now), None

        member.left = True
        self._cas(transition, now_of=lambda: self.now + member.skew, done=lambda _r: self._rejoin_later(member))

    def _rejoin_later(self, member: _Member) -> None:
        delay = self.rng.uniform(0, self.cfg.policy.session_timeout_s)
        self.at(self.now + delay, lambda: setattr(member, "left", False))

    def _crash_for_failover(self) -> None:
        owners = self._ownership_counts(self.state)
        candidates = [mid for mid in sorted(owners) if owners[mid] and not self.members[mid].crashed]
        if not candidates:
            return
        victim = self.members[self.rng.choice(candidates)]
        victim.crashed = True
        self.crashed_member = victim.member_id
        self.crash_time = self.now
        self.crash_shards = {sid for sid, s in self.state.shards.items() if s.owner == victim.member_id}

    def _alive(self, member: _Member) -> bool:
        return not member.crashed and not member.left

    # -- member ticks ---------------------------------------------------------------------------

    def _tick(self, member: _Member) -> None:
        period = self.cfg.policy.heartbeat_interval_s
        next_at = self.now + period * (1 + self.rng.uniform(-self.cfg.tick_jitter, self.cfg.tick_jitter))
        if member.crashed:
            return
        if member.left or member.busy or self.now < member.paused_until:
            self.at(max(next_at, member.paused_until), lambda: self._tick(member))
            return
        vanished = [
            r
            for r in self.runs.values()
            if r.outcome == "vanish" and r.ends_at <= self.now and not r.done and r.member_id == member.member_id
        ]

        def transition(state: GroupState, now: float) -> tuple[GroupState, list[Launch]]:
            started = time.thread_time()
            for run in vanished:
                reports = [protocol.report_of(launch) for launch in run.launches]
                state, _ = protocol.fail_run(state, reports, "run ended without reporting", now, self.cfg.policy)
            # A simulated run's record is written the moment it commits: the member confirms at once.
            state = protocol.confirm_recorded(state, member.member_id, list(state.unrecorded_runs))
            view = self.view()
            state = protocol.membership_step(state, member.member_id, now, self.cfg.policy, view=view)
            wanted = protocol.owned_idle_shards(state, member.member_id)
            marks = {sid: self.watermark(sid, self.now) for sid in wanted if protocol.part_of(sid) not in self.missing}
            before = {sid: state.shards[sid].committed for sid in marks}
            state, launches = protocol.plan(state, member.member_id, now, marks, self.cfg.policy)
            for sid, committed in before.items():
                shard = state.shards[sid]
                positioned = committed is None and shard.committed is not None and shard.late
                if self.cfg.lifecycle and positioned and shard.committed != marks[sid].low:
                    self.violations.append(f"new log of {sid} positioned at {shard.committed}, not its start")
            self.tick_ms.append((time.thread_time() - started) * 1000)
            return state, launches

        def done(launches: list[Launch] | None) -> None:
            member.busy = False
            if launches is not None:  # the tick's write landed; one given up after its CAS attempts failed nothing
                for run in vanished:  # (a member asks Dagster again at its next tick)
                    run.done = True
            for ranges in protocol.runs_of(launches or []).values():
                self._launch(ranges)
            self.at(max(next_at, self.now), lambda: self._tick(member))

        member.busy = True
        self._cas(transition, now_of=lambda: self.now + member.skew, done=done)

    # -- runs -----------------------------------------------------------------------------------

    def _launch(self, launches: list[Launch]) -> None:
        first = launches[0]
        if (first.run_key, first.member_id, tuple(x.epoch for x in launches)) in self.runs:
            return
        roll = self.rng.random()
        outcome = (
            "fail"
            if roll < self.cfg.p_run_fail
            else "vanish"
            if roll < self.cfg.p_run_fail + self.cfg.p_run_vanish
            else "ok"
        )
        ends = self.now + self.rng.uniform(*self.cfg.run_s)
        paused = self.rng.random() < self.cfg.p_run_straggle
        if paused:
            policy = self.cfg.policy
            ends += (
                policy.session_timeout_s + policy.drain_timeout_s + self.rng.uniform(0, 4 * policy.heartbeat_interval_s)
            )
        run = _Run(launches=launches, ends_at=ends, outcome=outcome)
        self.runs[run.key] = run
        self._touch(run, until=self.now if paused else ends)
        if outcome != "vanish":
            self.active[run.key] = run
            self.at(ends, lambda: self._finish(run))

    def _touch(self, run: _Run, until: float) -> None:
        """The run says it is alive now, and again every heartbeat until ``until`` (its end, or its pause)."""
        reports = [protocol.report_of(launch) for launch in run.launches]

        def touching(state: GroupState, now: float) -> tuple[GroupState, None]:
            return protocol.touch(state, reports, now), None

        self._cas(touching, now_of=lambda: self.now, done=lambda _r: None)
        following = self.now + self.cfg.policy.heartbeat_interval_s
        if following < until and not run.done:
            self.at(following, lambda: self._touch(run, until))

    def _finish(self, run: _Run) -> None:
        reports = [protocol.report_of(launch) for launch in run.launches]
        if any(launch.start < self.watermark(launch.shard, self.now).low for launch in run.launches):
            run.outcome = "fail"
        if run.outcome == "fail":

            def failing(state: GroupState, now: float) -> tuple[GroupState, Any]:
                return protocol.fail_run(state, reports, "simulated failure", now, self.cfg.policy)

            self._cas(failing, now_of=lambda: self.now, done=lambda _r: setattr(run, "done", True))
            return

        def committing(state: GroupState, _now: float) -> tuple[GroupState, Any]:
            new_state, outcome = protocol.commit_run(state, reports)
            if self.cfg.check_invariants:
                self._check_commit_oracle(state, reports, outcome)
            return new_state, outcome

        def done(outcome: protocol.RunCommitOutcome | None) -> None:
            run.done = True
            if outcome is None:
                return
            fresh = [o for o in outcome.outcomes.values() if o.accepted and not o.already_committed]
            if outcome.accepted and fresh:
                self.accepted += 1
                for report in reports:
                    self.committed_by.add((report.shard, report.run_key, report.member_id, report.epoch))
            elif not outcome.accepted:
                self.refused += 1
                # The run ends failed (its commit refused), and its member reports it, as the member sensor does
                # for a run Dagster shows failed: its ranges still in flight under it (those a reset or a new log
                # did not fence) are retried rather than held for good.
                self._cas(refused, now_of=lambda: self.now, done=lambda _r: None)

        def refused(state: GroupState, now: float) -> tuple[GroupState, Any]:
            return protocol.fail_run(state, reports, "commit refused", now, self.cfg.policy)

        self._cas(committing, now_of=lambda: self.now, done=done)

    # -- the simulated CAS store ----------------------------------------------------------------

    def _cas(
        self,
        transition: CasTransition,
        now_of: Callable[[], float],
        done: Callable[[Any], None],
        attempt: int = 0,
    ) -> None:
        snapshot, version = self.state, self.version
        new_state, result = transition(snapshot, now_of())
        latency = self.rng.uniform(*self.cfg.cas_latency_s)

        def save() -> None:
            if new_state is snapshot:
                done(result)
                return
            if self.version != version:
                self.conflicts += 1
                if attempt + 1 >= self.cfg.cas_attempts:
                    self.giveups += 1
                    done(None)
                    return
                backoff = self.rng.uniform(0, min(0.5, 0.02 * 2 ** (attempt + 1)))
                self.at(self.now + backoff, lambda: self._cas(transition, now_of, done, attempt + 1))
                return
            previous = self.state
            self.state, self.version = new_state, self.version + 1
            if self.cfg.check_invariants:
                self._check_step(previous, self.state)
            if self.cfg.measure_deltas:
                self._measure_delta(previous, self.state)
            self._observe(self.state)
            done(result)

        self.at(self.now + latency, save)

    def _measure_delta(self, before: GroupState, after: GroupState) -> None:
        after = after.model_copy(update={"revision": before.revision + 1})
        change = delta.diff(before, after)
        if delta.apply(before, change) != after:
            self.violations.append(f"delta of revision {after.revision} does not restore the state")
        size = len(delta.encode_delta(change))
        self.delta_bytes.append(size)
        if (
            set(change.model_dump(exclude_defaults=True)) <= {"base_revision", "revision", "members_set"}
            and len(change.members_set) == 1
            and all(before.members.get(m) is not None for m in change.members_set)
        ):
            self.heartbeat_delta_bytes.append(size)
        if len(self.state_bytes) < 50 or len(self.delta_bytes) % 50 == 0:
            self.state_bytes.append(len(protocol.encode_state(after)))

    # -- invariants -----------------------------------------------------------------------------

    def _check_commit_oracle(
        self, state: GroupState, reports: list[RangeReport], outcome: protocol.RunCommitOutcome
    ) -> None:
        """The protocol's answer against the simulator's own record: a fresh commit is valid only for the run
        in flight, and ``already_committed`` only for the very run (key, member, epoch) whose commit was
        accepted before; a run's ranges are accepted together or not at all."""
        verdicts = []
        for report in reports:
            shard = state.shards.get(report.shard)
            one = outcome.outcomes[report.shard]
            if one.already_committed:
                made_it = (report.shard, report.run_key, report.member_id, report.epoch) in self.committed_by
                if not made_it:
                    self.violations.append(f"commit oracle: {report} told already_committed by another run's commit")
                verdicts.append(made_it)
                continue
            valid = (
                shard is not None
                and shard.owner == report.member_id
                and shard.epoch == report.epoch
                and shard.committed == report.start
                and shard.inflight is not None
                and shard.inflight.run_key == report.run_key
            )
            verdicts.append(valid)
        if outcome.accepted != all(verdicts):
            self.violations.append(f"commit oracle: run {reports[0].run_key} accepted={outcome.accepted}, {verdicts}")

    def _check_step(self, before: GroupState, after: GroupState) -> None:
        added: list[protocol.GroupEvent] = []
        if after.events is not before.events:
            known = set(before.events)
            added = [e for e in after.events if e not in known]
        for shard_id, new in after.shards.items():
            old = before.shards.get(shard_id)
            if old is None or old is new:
                continue
            segment = (shard_id, new.identity, new.repositioned.epoch if new.repositioned else 0)
            moved = new.identity != old.identity or new.repositioned != old.repositioned
            recreated = old.identity is not None and old.committed is not None and new.identity != old.identity
            named = recreated and _recreation_named(added, shard_id, old.committed)
            if recreated and not named:
                self.violations.append(f"log of {shard_id} recreated without an event naming {old.committed}")
            if recreated and new.committed is not None and new.repositioned == old.repositioned:
                self.violations.append(f"offset {new.committed} of {shard_id} carried over into a new log")
            backwards = new.committed is None or (old.committed is not None and new.committed < old.committed)
            if old.committed is not None and backwards and not moved:
                self.violations.append(f"offset moved backwards: {shard_id} {old.committed} -> {new.committed}")
            if new.committed is not None and (old.committed is None or moved):
                self.first_position[segment] = new.committed
            elif old.committed is not None and new.committed is not None and new.committed > old.committed:
                self.coverage.setdefault(segment, []).append((old.committed, new.committed, "advance"))
            if old.inflight is not None and new.inflight == old.inflight and new.owner != old.owner:
                self.violations.append(f"shard with a range in flight changed owner: {shard_id}")
            if new.owner != old.owner and new.epoch <= old.epoch:
                self.violations.append(f"ownership changed without an epoch bump: {shard_id}")
            if new.owner is not None and new.owner not in after.members and new.inflight is None:
                self.violations.append(f"shard owned by a departed member with nothing in flight: {shard_id}")
        self._check_single_writer(after)

    def _check_single_writer(self, state: GroupState) -> None:
        """At most one live run per shard could commit: the one the state names, of the current epoch."""
        committable: dict[str, int] = {}
        for key, run in list(self.active.items()):
            if run.done or run.outcome != "ok":
                del self.active[key]
                continue
            for launch in run.launches:
                shard = state.shards[launch.shard]
                if (
                    shard.inflight is not None
                    and shard.inflight.run_key == launch.run_key
                    and shard.epoch == launch.epoch
                    and shard.owner == launch.member_id
                ):
                    committable[launch.shard] = committable.get(launch.shard, 0) + 1
        for shard_id, count in committable.items():
            if count > 1:
                self.violations.append(f"double-owner: {count} runs of {shard_id} can commit")

    def _check_coverage(self) -> None:
        for segment, spans in self.coverage.items():
            cursor = self.first_position.get(segment)
            for start, end, _ in spans:
                if cursor is not None and start != cursor:
                    self.violations.append(
                        f"committed ranges of {segment[0]} not contiguous at {start} (expected {cursor})"
                    )
                cursor = end

    # -- observations ---------------------------------------------------------------------------

    def _ownership_counts(self, state: GroupState) -> dict[str, int]:
        counts = dict.fromkeys(state.members, 0)
        for shard in state.shards.values():
            if shard.owner in counts:
                counts[shard.owner] += 1
        return counts

    def _balanced(self, state: GroupState) -> bool:
        live = [m for m in self.members.values() if self._alive(m) and self.now >= m.paused_until]
        if not live or any(m.member_id not in state.members for m in live):
            return False
        if any(is_assignable(state, s) and s.owner not in state.members for s in state.shards.values()):
            return False
        counts = self._ownership_counts(state)
        return max(counts.values()) - min(counts.values()) <= 1

    def _observe(self, state: GroupState) -> None:
        if self.balanced_at is None and self.cfg.cold_start and self._balanced(state):
            self.balanced_at = self.now
        waiting_for_failover = self.crashed_member is not None and self.failover_at is None
        if waiting_for_failover and all(
            state.shards[s].owner not in (None, self.crashed_member) and state.shards[s].owner in state.members
            for s in self.crash_shards
        ):
            self.failover_at = self.now


def random_scenario(seed: int) -> SimConfig:
    """A small random scenario with every fault class enabled, for property tests and the benchmark."""
    rng = random.Random(seed)
    period = 5.0
    policy = GroupPolicy(
        heartbeat_interval_s=period,
        session_timeout_s=rng.choice([15.0, 20.0, 30.0]),
        drain_timeout_s=rng.choice([10.0, 30.0]),
        max_records_per_run=rng.choice([50, 200, 1000]),
        max_attempts=rng.choice([1, 2, 3]),
        after_max_attempts=rng.choice(["park", "dead_letter"]),
        on_data_loss=rng.choice(["fail", "earliest"]),
        on_recreated=rng.choice(["park", "earliest"]),
        seek=rng.choice(["earliest", "latest"]),
        run_mode=rng.choice(["member", "member", "shard"]),
        min_backlog=rng.choice([1, 100]),
        max_wait_s=rng.choice([0.0, 10.0]),
    )
    members, shards, duration_s = rng.randint(1, 6), rng.randint(1, 24), rng.uniform(60, 200)
    cas_latency_s = (0.001, rng.choice([0.01, 0.2]))
    run_max_s = rng.choice([5.0, 25.0])
    return SimConfig(
        members=members,
        shards=shards,
        seed=seed,
        policy=policy,
        duration_s=duration_s,
        # Quiet long enough for the longest run (a paused one: a session and a drain timeout, four heartbeats and
        # a run) to end: a shard with a range in flight never moves, and a member's run holds all its shards.
        quiet_s=2 * (policy.session_timeout_s + policy.drain_timeout_s) + 10 * period + run_max_s,
        cas_latency_s=cas_latency_s,
        run_s=(1.0, run_max_s),
        produce_per_s=rng.choice([5.0, 50.0]),
        retention_records=rng.choice([None, None, 400]),
        p_run_fail=rng.choice([0.0, 0.1, 0.3]),
        p_run_vanish=rng.choice([0.0, 0.05]),
        p_run_straggle=rng.choice([0.0, 0.1]),
        faults=True,
        max_skew_s=rng.choice([0.0, 2.0]),
        cold_start=rng.random() < 0.5,
        lifecycle=rng.random() < 0.5,
    )


def _recreation_named(added: Sequence[protocol.GroupEvent], shard_id: str, committed: int | None) -> bool:
    """Whether the events of one step name every record of the old log from ``committed`` on: a ``recreated``
    event from there, or one from the end of the ranges the same step dead-lettered or reported lost from there
    (a run that failed for good as its member was evicted, in the step that saw the log recreated)."""
    events = [e for e in added if e.shard == shard_id]
    position = committed
    while position is not None:
        if any(e.kind == "recreated" and e.start == position for e in events):
            return True
        skipped = [e.end for e in events if e.kind in ("dead_letter", "data_loss") and e.start == position]
        position = max((end for end in skipped if end is not None and end > position), default=None)
    return False
