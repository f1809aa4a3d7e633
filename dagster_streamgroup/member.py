"""One group member: a tick, a commit, a failure report, a leave, each a CAS loop around pure transitions.

Every attempt re-reads the state and re-runs the transitions on it; nothing computed in a failed attempt
is reused (Pravega #2042: a result leaked from a failed CAS made two readers own one segment). Conflicts
back off with full jitter and a small cap; a tick that still conflicts gives up and its work waits for the
next tick, so a sensor tick never runs long.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tenacity import RetryError, Retrying, retry_if_result, stop_after_attempt, wait_random_exponential

from dagster_streamgroup import protocol
from dagster_streamgroup.protocol import (
    CommitOutcome,
    FailOutcome,
    GroupEvent,
    GroupPolicy,
    GroupState,
    Launch,
    RangeReport,
    RunCommitOutcome,
    StreamView,
    Watermark,
)
from dagster_streamgroup.stores import pause_hook
from dagster_streamgroup.stores.base import StateStore, state_key
from dagster_streamgroup.streams.base import MirroredOffset, StreamBackend, StreamError, Watermarks

log = logging.getLogger(__name__)

R = TypeVar("R")
Transition = Callable[[GroupState | None, float], tuple[GroupState | None, R]]
"""(fresh state or None when absent, store time) -> (state to write or the same object for no write, result)."""


class ContentionError(Exception):
    """The state kept changing under us for every attempt; the work is left for the next tick."""


@dataclass
class _Conflict:
    pass


_CONFLICT = _Conflict()


@dataclass(frozen=True)
class CasStats:
    attempts: int
    conflicts: int
    state: GroupState | None
    """The state as this call left it (what it wrote, or what it read when nothing needed writing)."""


def update_state(
    store: StateStore,
    key: str,
    transition: Transition[R],
    *,
    max_attempts: int = 6,
    backoff_base_s: float = 0.02,
    backoff_cap_s: float = 0.5,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[R, CasStats]:
    """Apply ``transition`` under compare-and-set, re-running it on fresh state after each conflict."""
    attempts = 0
    final: list[GroupState | None] = [None]

    def attempt() -> tuple[R] | _Conflict:
        nonlocal attempts
        attempts += 1
        current, token = store.load(key)
        new_state, result = transition(current, store.now())
        if new_state is None or new_state is current:
            final[0] = current
            return (result,)
        written = new_state.model_copy(update={"revision": new_state.revision + 1})
        held = pause_hook.hold(key, token)  # a test hook, off unless $STREAMGROUP_CHAOS_PAUSE_FILE is set
        saved = store.save_if(key, written, token)
        if held is not None:
            pause_hook.report(held, key, token, saved)
        if not saved:
            return _CONFLICT
        final[0] = written
        return (result,)

    retrying = Retrying(
        retry=retry_if_result(lambda outcome: outcome is _CONFLICT),
        wait=wait_random_exponential(multiplier=backoff_base_s, max=backoff_cap_s),
        stop=stop_after_attempt(max_attempts),
        sleep=sleep,
    )
    try:
        outcome = retrying(attempt)
    except RetryError as exc:
        raise ContentionError(f"state {key!r} changed under every one of {max_attempts} attempts") from exc
    assert not isinstance(outcome, _Conflict)
    return outcome[0], CasStats(attempts=attempts, conflicts=attempts - 1, state=final[0])


RUN_CAS: dict[str, Any] = {"max_attempts": 30, "backoff_cap_s": 2.0}
"""A run's commit or failure report retries its compare-and-set longer than a sensor tick does (about a
minute at most): a tick's leftovers wait for the next tick, but a run that gives up its commit to contention
would have all its records read again."""


@dataclass(frozen=True)
class TickReport:
    member_id: str
    state: GroupState
    new_launches: list[Launch]
    """Ranges planned in this tick."""
    inflight: list[Launch]
    """Every range in flight under this member, the new ones included: request those whose run does not exist."""
    owned: list[str]
    gained: list[str]
    lost: list[str]
    new_events: list[GroupEvent]
    watermarks: dict[str, Watermark]
    stats: CasStats
    waiting_for_grace: bool = False
    now: float = 0.0
    """The store's time of the tick's write."""
    notes: tuple[str, ...] = ()
    """What the tick did around the state that its sensor should say (the mirror restored, or failing)."""

    @property
    def to_request(self) -> list[Launch]:
        """``inflight`` less the runs waiting out a launch backoff (``protocol.held_back``)."""
        held = protocol.held_back(self.state, self.member_id, self.now)
        return [x for x in self.inflight if x.run_key not in held]

    @property
    def lag(self) -> dict[str, int]:
        """Records behind what was written per owned shard (what is known from this tick), an open transaction's
        records included: they are the ones the group waits for."""
        out: dict[str, int] = {}
        for shard_id in self.owned:
            shard = self.state.shards[shard_id]
            mark = self.watermarks.get(shard_id)
            if mark is not None and shard.committed is not None:
                written = max(mark.high, mark.uncommitted_high or 0)
                if written >= shard.committed:  # a log that ends below the offset has no lag to tell (see status)
                    out[shard_id] = written - shard.committed
        return out


def _refused_without_state(reports: Sequence[RangeReport]) -> RunCommitOutcome:
    """A run's commit where the group has no state (it was deleted or never written): refused for every range."""
    refused = CommitOutcome(
        accepted=False, refusal=protocol.Refusal.UNKNOWN_SHARD, message="the group has no state yet"
    )
    return RunCommitOutcome(accepted=False, outcomes={r.shard: refused for r in reports})


def _other_log(mirrored: MirroredOffset, identity: str | None) -> bool:
    """Our mirror, written for a log that is not the shard's now (a late mirror landing on a recreated topic)."""
    return mirrored.ours and mirrored.identity is not None and identity is not None and mirrored.identity != identity


def mirror_identities(state: GroupState | None, shards: Iterable[str]) -> dict[str, str | None]:
    """The identity of the log each shard's offsets count in, as ``state`` records it."""
    if state is None:
        return {}
    return {s: shard.identity for s in shards if (shard := state.shards.get(s)) is not None}


def _positioned(marks: Mapping[str, Watermarks]) -> dict[str, Watermark]:
    """The watermarks ``plan`` needs of shards already positioned (a run's own)."""
    return {shard: Watermark(low=m.low, high=m.high, uncommitted_high=m.uncommitted_high) for shard, m in marks.items()}


@dataclass
class GroupMember:
    """A member of ``group`` over ``backend``'s stream, keeping its state in ``store``."""

    store: StateStore
    backend: StreamBackend
    group: str
    member_id: str
    policy: GroupPolicy = field(default_factory=GroupPolicy)
    sleep: Callable[[float], None] = time.sleep
    _watermarks: dict[str, Watermark] = field(default_factory=dict, init=False, repr=False)
    _mirrors: dict[str, MirroredOffset | None] = field(default_factory=dict, init=False, repr=False)
    _carried: bool = field(default=False, init=False, repr=False)

    @property
    def key(self) -> str:
        return state_key(self.backend.stream_id, self.group)

    def _fetch_watermarks(self, state: GroupState, view: StreamView) -> dict[str, Watermark]:
        """Watermarks of the shards ``plan`` may launch, each with the group's offset as the stream records it
        (where the seek policy would otherwise position a shard, and where a reset made around the group shows).
        Fetched once per tick, whatever the CAS retries."""
        shard_ids = [
            s for s in protocol.owned_idle_shards(state, self.member_id) if protocol.part_of(s) not in view.missing
        ]
        missing = [s for s in shard_ids if s not in self._watermarks]
        if missing:
            watched = self.backend.watches_group_offsets
            asked = [s for s in missing if watched or state.shards[s].committed is None]
            mirrors = self.backend.group_offsets(self.group, asked) if asked else {}
            self._mirrors.update(mirrors)
            for shard_id, mark in self.backend.watermarks(missing).items():
                identity = protocol.identity_of(view, shard_id)
                mirrored = mirrors.get(shard_id)
                group_committed, foreign = None, False
                if mirrored is not None and not _other_log(mirrored, identity):
                    group_committed, foreign = mirrored.offset, not mirrored.ours
                at_timestamp = None
                timestamp = self.policy.seek_timestamp_ms
                unpositioned = state.shards[shard_id].committed is None
                if unpositioned and group_committed is None and timestamp is not None:
                    at_timestamp = self.backend.offset_for_time(shard_id, timestamp)
                self._watermarks[shard_id] = Watermark(
                    low=mark.low,
                    high=mark.high,
                    group_committed=group_committed,
                    mirror_foreign=foreign,
                    identity=identity,
                    at_timestamp=at_timestamp,
                    uncommitted_high=mark.uncommitted_high,
                )
        return {s: self._watermarks[s] for s in shard_ids if s in self._watermarks}

    def view(self) -> StreamView:
        """What the backend lists of the stream now, for the protocol."""
        listing = self.backend.listing()
        return StreamView(
            shards=tuple(listing.shards),
            parts=listing.parts,
            identities=dict(listing.identities),
            missing=listing.missing,
        )

    def tick(self, recorded: Collection[str] = ()) -> TickReport:
        """Heartbeat, evict, follow the stream, rebalance, and plan the next ranges, in one CAS write; the committed
        runs of ``recorded`` (run keys) are confirmed recorded in the orchestrator in the same write. Then the
        mirror of the member's shards is brought to the state where it is not (``_mirror_upkeep``)."""
        self.backend.check_group(self.group)
        view = self.view()
        self._watermarks, self._mirrors, self._carried = {}, {}, False
        before: dict[str, Any] = {}

        def transition(current: GroupState | None, now: float) -> tuple[GroupState, list[Launch]]:
            base = current if current is not None else self._carried_over(now)
            before["state"] = current
            before["now"] = now
            base = protocol.confirm_recorded(base, self.member_id, recorded)
            state = protocol.membership_step(base, self.member_id, now, self.policy, view=view)
            marks = self._fetch_watermarks(state, view)
            return protocol.plan(state, self.member_id, now, marks, self.policy)

        launches, stats = update_state(self.store, self.key, transition, sleep=self.sleep)
        assert stats.state is not None
        report = self._report(before.get("state"), stats.state, launches, stats, before.get("now", 0.0))
        notes = self._mirror_upkeep(report, view)
        return dataclasses.replace(report, notes=tuple(notes)) if notes else report

    def _mirror_upkeep(self, report: TickReport, view: StreamView) -> list[str]:
        """The stream's record of the group (Kafka's group offsets, what lag tools and a lost state's successor
        read) brought to the state for the member's idle shards that the tick looked at: a shard the seek policy
        just positioned is mirrored at once (a state lost before its first commit resumes there, not from the seek
        policy again); a mirror behind (a run killed before its mirror, a skip past lost records) catches up; an
        offset something else wrote (a reset with Kafka's tool, refused by the tick with an event) or that counts
        in a deleted log, or one ahead of the state, is restored. After a carry-over, every shard's mirror is
        marked as ours. Best effort: a failure is a note, and the next tick looks again."""
        state = report.state
        listed = set(view.shards)
        forward: dict[str, int] = {}
        restore: dict[str, int] = {}
        for shard_id, mark in self._watermarks.items():
            shard = state.shards.get(shard_id)
            if shard is None or shard.committed is None or shard.owner != self.member_id or shard_id not in listed:
                continue  # a partition that does not exist (a topic recreated with fewer) has no offset to keep
            if shard_id not in self._mirrors:
                continue  # not asked (a backend that reads the group's offsets of unpositioned shards only)
            mirrored = self._mirrors.get(shard_id)
            if mirrored is None:
                forward[shard_id] = shard.committed
            elif not mirrored.ours or _other_log(mirrored, mark.identity) or mirrored.offset > shard.committed:
                restore[shard_id] = shard.committed
            elif mirrored.offset < shard.committed:
                forward[shard_id] = shard.committed
        if self._carried:
            scope = view.parts
            for shard_id, shard in state.shards.items():
                carried = shard.committed is not None and protocol.in_scope(scope, shard_id) and shard_id in listed
                if carried and shard.committed is not None and shard_id not in forward:
                    restore.setdefault(shard_id, shard.committed)
        notes = []
        for offsets, how in ((forward, False), (restore, True)):
            if not offsets:
                continue
            try:
                self.backend.commit(self.group, offsets, identities=mirror_identities(state, offsets), restore=how)
            except (StreamError, ValueError) as exc:
                log.warning("mirroring the offsets of %s failed (the next tick looks again): %s", sorted(offsets), exc)
                notes.append(f"mirroring the offsets of {len(offsets)} shard(s) failed (the next tick looks again)")
                continue
            if how:
                notes.append(f"restored the stream's record of the group's offsets of {', '.join(sorted(offsets))}")
        return notes

    def _carried_over(self, now: float) -> GroupState:
        """A new state, or the one an earlier version kept under another key, carried over once with an event. The
        old object is closed first (``protocol.closed``): a member of that version, which cannot read it any more,
        stops rather than plan its shards beside ours."""
        for old_stream in self.backend.legacy_stream_ids:
            old_key = state_key(old_stream, self.group)

            def close(current: GroupState | None, _now: float) -> tuple[GroupState | None, GroupState | None]:
                if current is None:
                    return None, None
                return protocol.closed(current, self.key), current

            found, _ = update_state(self.store, old_key, close, sleep=self.sleep)
            if found is not None:
                self._carried = True
                carried = protocol.carry_over(found, self.backend.stream_id, old_stream, now)
                return carried.model_copy(update={"moved_to": None})
        return protocol.new_group(self.backend.stream_id, self.group, now)

    def _report(
        self, old: GroupState | None, state: GroupState, launches: list[Launch], stats: CasStats, now: float
    ) -> TickReport:
        owned = [sid for sid, s in state.shards.items() if s.owner == self.member_id]
        previously = {sid for sid, s in old.shards.items() if s.owner == self.member_id} if old else set()
        old_events = set(old.events) if old else set()
        new_events = [e for e in state.events if e not in old_events]
        me = state.members.get(self.member_id)
        waiting = me is not None and me.joined + self.policy.grace_s > me.heartbeat
        return TickReport(
            member_id=self.member_id,
            state=state,
            new_launches=launches,
            inflight=protocol.inflight_launches(state, self.member_id),
            owned=owned,
            gained=sorted(set(owned) - previously),
            lost=sorted(previously - set(owned)),
            new_events=new_events,
            watermarks=dict(self._watermarks),
            stats=stats,
            waiting_for_grace=waiting,
            now=now,
        )

    def leave(self) -> bool:
        """Leave the group now; shards go back at their committed offsets (runs in flight drain)."""

        def transition(current: GroupState | None, now: float) -> tuple[GroupState | None, bool]:
            if current is None or self.member_id not in current.members:
                return current, False
            return protocol.leave(current, self.member_id, now), True

        left, _ = update_state(self.store, self.key, transition, sleep=self.sleep)
        return left

    def commit(self, report: RangeReport) -> CommitOutcome:
        """The fenced commit of a finished range, then the monotonic mirror into the backend."""
        outcome, stats = self.commit_state_only(report)
        if outcome.accepted and not outcome.already_committed:
            self.mirror({report.shard: report.end}, stats.state)
        return outcome

    def commit_state_only(self, report: RangeReport) -> tuple[CommitOutcome, CasStats]:
        identities = self._identities([report.shard])

        def transition(current: GroupState | None, _now: float) -> tuple[GroupState | None, CommitOutcome]:
            if current is None:
                return None, CommitOutcome(
                    accepted=False, refusal=protocol.Refusal.UNKNOWN_SHARD, message="the group has no state yet"
                )
            return protocol.commit(current, report, identities.get(report.shard))

        return update_state(self.store, self.key, transition, sleep=self.sleep)

    def commit_run(self, reports: Sequence[RangeReport]) -> RunCommitOutcome:
        """The fenced commit of every range of a finished run (all or none), then one mirror call."""
        outcome, stats = self.commit_run_state_only(reports)
        fresh = {
            r.shard: r.end for r in reports if outcome.accepted and not outcome.outcomes[r.shard].already_committed
        }
        if fresh:
            self.mirror(fresh, stats.state)
        return outcome

    def mirror(self, offsets: Mapping[str, int], state: GroupState | None) -> dict[str, int]:
        """Committed offsets into the backend (monotonic), each marked with the identity of the log the state
        says it counts in, so that none lands on a log recreated since."""
        return self.backend.commit(self.group, offsets, identities=mirror_identities(state, offsets))

    def _identities(self, shards: Sequence[str]) -> dict[str, str]:
        """The identities of the shards' logs now, for a commit to compare with the state's: a run that read a
        log recreated under its range is refused. Where the backend cannot answer, the commit goes on without
        (the ticks still fence what they saw recreated), as a broker's trouble must not throw a run's work away."""
        try:
            return self.backend.identities(shards)
        except StreamError as exc:
            log.warning("reading the identities of %s failed; committing without comparing them: %s", shards, exc)
            return {}

    def commit_run_state_only(
        self, reports: Sequence[RangeReport], dead: Mapping[str, DeadRecords] | None = None
    ) -> tuple[RunCommitOutcome, CasStats]:
        """The fenced commit of a run's ranges, with ``dead``: the records of some ranges that could not be decoded,
        recorded as dead letters in the same write."""
        identities = self._identities([r.shard for r in reports])

        def transition(current: GroupState | None, now: float) -> tuple[GroupState | None, RunCommitOutcome]:
            if current is None:
                return None, _refused_without_state(reports)
            state, outcome = protocol.commit_run(current, reports, identities)
            return _with_dead_records(state, reports, outcome, dead, now), outcome

        return update_state(self.store, self.key, transition, sleep=self.sleep, **RUN_CAS)

    def commit_run_and_carry_on(
        self,
        reports: Sequence[RangeReport],
        marks: Mapping[str, Watermarks],
        dead: Mapping[str, DeadRecords] | None = None,
    ) -> tuple[RunCommitOutcome, CasStats, list[Launch]]:
        """The fenced commit of a finished run (as ``commit_run_state_only``) and, in the same write, the next
        ranges of its shards under its run key (``protocol.commit_and_carry_on``); ``marks``: the shards'
        watermarks read after the run processed its records."""
        watermarks = _positioned(marks)
        identities = self._identities([r.shard for r in reports])

        def transition(
            current: GroupState | None, now: float
        ) -> tuple[GroupState | None, tuple[RunCommitOutcome, list[Launch]]]:
            if current is None:
                return None, (_refused_without_state(reports), [])
            state, outcome, launches = protocol.commit_and_carry_on(
                current, reports, now, watermarks, self.policy, identities
            )
            return _with_dead_records(state, reports, outcome, dead, now), (outcome, launches)

        (outcome, launches), stats = update_state(self.store, self.key, transition, sleep=self.sleep, **RUN_CAS)
        return outcome, stats, launches

    def carry_on(
        self, run_key: str, shards: Collection[str], marks: Mapping[str, Watermarks]
    ) -> tuple[list[Launch], GroupState | None]:
        """The next ranges of ``shards`` for the run ``run_key``, which committed their ranges and waits for a
        wave's worth of records (``protocol.carry_on``); also the state as this call left it."""
        watermarks = _positioned(marks)

        def transition(current: GroupState | None, now: float) -> tuple[GroupState | None, list[Launch]]:
            if current is None:
                return None, []
            return protocol.carry_on(current, self.member_id, run_key, shards, now, watermarks, self.policy)

        launches, stats = update_state(self.store, self.key, transition, sleep=self.sleep)
        return launches, stats.state

    def touch_run(self, reports: Sequence[RangeReport]) -> None:
        """The run of ``reports`` says it is alive (three times per session timeout while it executes)."""

        def transition(current: GroupState | None, now: float) -> tuple[GroupState | None, None]:
            if current is None:
                return None, None
            return protocol.touch(current, reports, now), None

        update_state(self.store, self.key, transition, sleep=self.sleep)

    def fail_run(self, reports: Sequence[RangeReport], reason: str) -> dict[str, FailOutcome]:
        """Every range of a failed run is retried or given up on its own shard, in one state write."""

        def transition(current: GroupState | None, now: float) -> tuple[GroupState | None, dict[str, FailOutcome]]:
            if current is None:
                return None, dict.fromkeys((r.shard for r in reports), FailOutcome.IGNORED)
            return protocol.fail_run(current, reports, reason, now, self.policy)

        outcome, _ = update_state(self.store, self.key, transition, sleep=self.sleep, **RUN_CAS)
        return outcome

    def park_run(self, reports: Sequence[RangeReport], parked: Mapping[str, str]) -> dict[str, FailOutcome]:
        """The ranges of ``parked`` (shard -> why) stop at once (``protocol.park_now``); the run's other ranges
        are run again with their bounds, without counting an attempt (nothing was wrong with them), in the same
        write."""

        def transition(current: GroupState | None, now: float) -> tuple[GroupState | None, dict[str, FailOutcome]]:
            if current is None:
                return None, dict.fromkeys((r.shard for r in reports), FailOutcome.IGNORED)
            outcomes: dict[str, FailOutcome] = {}
            state = current
            for report in reports:
                if report.shard in parked:
                    state, outcomes[report.shard] = protocol.park_now(state, report, parked[report.shard], now)
            others = [r for r in reports if r.shard not in parked]
            if others:
                why = "another range of the run was parked: " + "; ".join(sorted(parked.values()))[:500]
                state, _ = protocol.launch_failed(state, others, why, now, self.policy)
                outcomes.update(dict.fromkeys((r.shard for r in others), FailOutcome.RETRY))
            return state, outcomes

        outcome, _ = update_state(self.store, self.key, transition, sleep=self.sleep, **RUN_CAS)
        return outcome

    def launch_failed(self, reports: Sequence[RangeReport], reason: str) -> int:
        """The launch of the run of ``reports`` raised: relaunched later, not an attempt. Returns the launches
        of it that raised in a row (0: already handled)."""

        def transition(current: GroupState | None, now: float) -> tuple[GroupState | None, int]:
            if current is None:
                return None, 0
            return protocol.launch_failed(current, reports, reason, now, self.policy)

        outcome, _ = update_state(self.store, self.key, transition, sleep=self.sleep, **RUN_CAS)
        return outcome

    def fail(self, report: RangeReport, reason: str) -> FailOutcome:
        def transition(current: GroupState | None, now: float) -> tuple[GroupState | None, FailOutcome]:
            if current is None:
                return None, FailOutcome.IGNORED
            return protocol.fail(current, report, reason, now, self.policy)

        outcome, _ = update_state(self.store, self.key, transition, sleep=self.sleep)
        return outcome

    def wait_for_run_end(self, run_keys: Collection[str], timeout_s: float, poll_s: float = 0.2) -> bool:
        """Polls the state until one of this member's runs ``run_keys`` holds no range in flight any more (it
        committed, failed, or was fenced out), for at most ``timeout_s``. True when one did."""
        if not run_keys:
            return False
        deadline = time.monotonic() + timeout_s
        while True:
            if protocol.runs_still_inflight(self.load(), self.member_id, run_keys) != set(run_keys):
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.sleep(min(poll_s, left))

    def load(self) -> GroupState | None:
        state, _ = self.store.load(self.key)
        return state


@dataclass(frozen=True)
class DeadRecords:
    """The records of one range that could not be decoded: how many, the first ones with their raw bytes, why."""

    count: int
    records: tuple[protocol.DeadRecord, ...]
    reason: str


def _with_dead_records(
    state: GroupState | None,
    reports: Sequence[RangeReport],
    outcome: RunCommitOutcome,
    dead: Mapping[str, DeadRecords] | None,
    now: float,
) -> GroupState | None:
    """``state`` with the dead letters of the ranges this commit accepted for the first time."""
    if not dead or state is None or not outcome.accepted:
        return state
    for report in reports:
        letters = dead.get(report.shard)
        if letters is None or outcome.outcomes[report.shard].already_committed:
            continue
        state = protocol.add_dead_records(state, report, letters.count, letters.records, letters.reason, now)
    return state
