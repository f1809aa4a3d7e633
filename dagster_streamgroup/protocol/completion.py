"""How a run's ranges end: commit (fenced), fail (retry, then park or dead-letter), and operator actions.

A commit succeeds only if the run still holds the shard: same owner, same epoch, the shard's committed
offset equals the range start, and the in-flight record is this run's. Anything else is a typed refusal
that names the reason and the current owner, and offsets never move backwards. Replaying an accepted
commit (an ambiguous CAS write retried) reports ``already_committed`` to the run that made it, and only to
it: same run key, member and epoch. A run over several ranges commits all of them in one transition or
none (``commit_run``), each range checked on its own.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from dagster_streamgroup.protocol.membership import add_events, released_with_bounds
from dagster_streamgroup.protocol.planning import Launch
from dagster_streamgroup.protocol.policy import GroupPolicy
from dagster_streamgroup.protocol.state import (
    DeadLetter,
    DeadRecord,
    EventKind,
    GroupEvent,
    GroupState,
    InFlight,
    Parked,
    ShardState,
    UnrecordedRun,
    evolve,
    handed_over,
)


class RangeReport(BaseModel):
    """What a run presents when it ends: the identity it was launched with."""

    model_config = ConfigDict(frozen=True)
    shard: str
    member_id: str
    epoch: int
    start: int
    end: int
    run_key: str


def report_of(launch: Launch) -> RangeReport:
    """What the run of ``launch`` presents when it ends."""
    return RangeReport(
        shard=launch.shard,
        member_id=launch.member_id,
        epoch=launch.epoch,
        start=launch.start,
        end=launch.end,
        run_key=launch.run_key,
    )


class Refusal(StrEnum):
    UNKNOWN_SHARD = "unknown_shard"
    OWNERSHIP_MOVED = "ownership_moved"
    NOT_IN_FLIGHT = "not_in_flight"
    WRONG_START = "wrong_start"
    RECREATED = "recreated"
    """The shard's log was deleted and created again since the range was planned: its offsets are the old log's."""
    RESET = "reset"
    """An operator moved the shard since the range was planned (``streamgroup reset``)."""


class CommitOutcome(BaseModel):
    model_config = ConfigDict(frozen=True)
    accepted: bool
    already_committed: bool = False
    refusal: Refusal | None = None
    owner: str | None = None
    epoch: int | None = None
    committed: int | None = None
    message: str = ""


def _leave_if_departed(state: GroupState, shard: ShardState) -> ShardState:
    """A draining shard whose run has reported goes back to the pool (epoch bumped)."""
    if shard.owner is not None and shard.owner not in state.members:
        return handed_over(shard, None)
    return shard


def commit(state: GroupState, report: RangeReport, identity: str | None = None) -> tuple[GroupState, CommitOutcome]:
    """``identity``: the identity of the shard's log now, looked up after the run read its records, where the
    backend has one: a run that read a log recreated under its range is refused, even before any tick saw it. A
    shard positioned before its log had an identity (an empty v3io shard has no object to carry one) takes it here:
    the log its committed offset now counts in, so a recreation before the next tick is told from it."""
    shard = state.shards.get(report.shard)
    if shard is None:
        return state, CommitOutcome(
            accepted=False, refusal=Refusal.UNKNOWN_SHARD, message=f"shard {report.shard} is not in the group"
        )
    if (
        shard.last_run_key == report.run_key
        and shard.last_commit_member == report.member_id
        and shard.last_commit_epoch == report.epoch
        and shard.committed is not None
        and shard.committed >= report.end
    ):
        return state, CommitOutcome(
            accepted=True,
            already_committed=True,
            owner=shard.owner,
            epoch=shard.epoch,
            committed=shard.committed,
            message=f"range [{report.start}, {report.end}) of shard {report.shard} was already committed",
        )

    def refuse(reason: Refusal, message: str) -> tuple[GroupState, CommitOutcome]:
        return state, CommitOutcome(
            accepted=False,
            refusal=reason,
            owner=shard.owner,
            epoch=shard.epoch,
            committed=shard.committed,
            message=message,
        )

    moved = shard.repositioned
    if moved is not None and report.epoch < moved.epoch:
        how = "deleted and created again" if moved.cause == "recreated" else "reset by an operator"
        return refuse(
            Refusal.RECREATED if moved.cause == "recreated" else Refusal.RESET,
            f"shard {report.shard}: its log was {how} after the range [{report.start}, {report.end}) was planned "
            f"(epoch {report.epoch}, now {shard.epoch}); the range's offsets are not the shard's any more",
        )
    if identity is not None and shard.identity is not None and identity != shard.identity:
        return refuse(
            Refusal.RECREATED,
            f"shard {report.shard}: its log is not the one the range [{report.start}, {report.end}) was planned over "
            f"(identity {shard.identity}, now {identity}: deleted and created again); nothing of it is committed",
        )
    if shard.owner != report.member_id or shard.epoch != report.epoch:
        return refuse(
            Refusal.OWNERSHIP_MOVED,
            f"shard {report.shard} moved: it is now owned by {shard.owner or 'nobody'} at epoch {shard.epoch}; "
            f"this run was launched by {report.member_id} at epoch {report.epoch}",
        )
    if shard.inflight is None or shard.inflight.run_key != report.run_key:
        current = shard.inflight.run_key if shard.inflight else "none"
        return refuse(
            Refusal.NOT_IN_FLIGHT,
            f"shard {report.shard}: run {report.run_key} is not the range in flight (in flight: {current})",
        )
    if shard.committed != report.start:
        return refuse(
            Refusal.WRONG_START,
            f"shard {report.shard}: committed offset is {shard.committed}, the range starts at {report.start}",
        )
    done = evolve(
        shard,
        committed=report.end,
        identity=shard.identity or identity,
        inflight=None,
        attempt=0,
        retry_end=None,
        last_run_key=report.run_key,
        last_commit_member=report.member_id,
        last_commit_epoch=report.epoch,
    )
    done = _leave_if_departed(state, done)
    new_state = state.model_copy(
        update={
            "shards": {**state.shards, report.shard: done},
            "unrecorded_runs": _with_unrecorded(state.unrecorded_runs, report),
        }
    )
    return new_state, CommitOutcome(
        accepted=True,
        owner=done.owner,
        epoch=done.epoch,
        committed=done.committed,
        message=f"committed shard {report.shard} up to {report.end}",
    )


def _with_unrecorded(unrecorded: dict[str, UnrecordedRun], report: RangeReport) -> dict[str, UnrecordedRun]:
    """The run's entry with this range added: its member records it, or confirms Dagster did."""
    entry = unrecorded.get(report.run_key)
    ranges = ((report.shard, report.start, report.end),)
    if entry is None:
        entry = UnrecordedRun(member_id=report.member_id, epoch=report.epoch, ranges=ranges)
    else:
        entry = evolve(entry, ranges=entry.ranges + ranges)
    return {**unrecorded, report.run_key: entry}


def deployment_of(member_id: str) -> str | None:
    """The deployment part of a member id (``<sensor>@<deployment>``): members of one deployment share its
    Dagster instance, so each can read the others' runs."""
    return member_id.rsplit("@", 1)[1] if "@" in member_id else None


def settle_orphaned_unrecorded(state: GroupState, now: float, drain_timeout_s: float) -> GroupState:
    """Entries of a deployment with no live member: marked when first seen so, dropped with an event naming their
    ranges once that has lasted ``drain_timeout_s`` (nobody is left who can see whether Dagster recorded them);
    unmarked if a member of the deployment comes back."""
    if not state.unrecorded_runs:
        return state
    deployments = {deployment_of(m) for m in state.members}
    kept: dict[str, UnrecordedRun] = {}
    events: list[GroupEvent] = []
    for key, entry in state.unrecorded_runs.items():
        alive = deployment_of(entry.member_id) in deployments
        if alive:
            kept[key] = entry if entry.orphaned_at is None else evolve(entry, orphaned_at=None)
        elif entry.orphaned_at is None:
            kept[key] = evolve(entry, orphaned_at=now)
        elif now - entry.orphaned_at < drain_timeout_s:
            kept[key] = entry
        else:
            ranges = ", ".join(f"{shard} [{start}, {end})" for shard, start, end in entry.ranges)
            events.append(
                GroupEvent(
                    kind=EventKind.UNRECORDED_DROPPED,
                    at=now,
                    member_id=entry.member_id,
                    detail=f"run {key} committed {ranges}, and no member of its deployment has been left for "
                    f"{now - entry.orphaned_at:.0f} s to check that Dagster recorded its materializations: "
                    "the entry is dropped (the offsets stay committed; look the run up in its deployment)",
                )
            )
    if kept == state.unrecorded_runs:
        return state
    return add_events(state.model_copy(update={"unrecorded_runs": kept}), *events)


def checks_unrecorded(state: GroupState, member_id: str, entry: UnrecordedRun) -> bool:
    """Whether ``member_id`` is the one to check ``entry``'s records (and repair the missing ones): its launching
    member while that is a member of the group; once it is gone for good (evicted, its sensor deleted), the
    first live member of the same deployment by id (members of a deployment share its Dagster instance, so it
    sees the run's records and any repair recorded for it). One checker at a time, so a range is repaired once."""
    if entry.member_id in state.members:
        return entry.member_id == member_id
    deployment = deployment_of(entry.member_id)
    if deployment is None:  # a member id that names no deployment: nobody else can see its runs
        return False
    stand_ins = sorted(m for m in state.members if deployment_of(m) == deployment)
    return bool(stand_ins) and stand_ins[0] == member_id


def confirm_recorded(state: GroupState, member_id: str, run_keys: Collection[str]) -> GroupState:
    """``member_id`` has seen the runs of ``run_keys`` recorded in Dagster (by the runs, or by a repair): their
    entries go, where it is the one to check them (``checks_unrecorded``)."""
    gone = [
        k
        for k in run_keys
        if (u := state.unrecorded_runs.get(k)) is not None and checks_unrecorded(state, member_id, u)
    ]
    if not gone:
        return state
    kept = {k: u for k, u in state.unrecorded_runs.items() if k not in gone}
    return state.model_copy(update={"unrecorded_runs": kept})


class RunCommitOutcome(BaseModel):
    """The commit of a run's ranges: all accepted in one state write, or none (each refusal typed per shard)."""

    model_config = ConfigDict(frozen=True)
    accepted: bool
    outcomes: dict[str, CommitOutcome]

    @property
    def refusals(self) -> dict[str, CommitOutcome]:
        return {shard: o for shard, o in self.outcomes.items() if not o.accepted}

    @property
    def message(self) -> str:
        refused = self.refusals
        if not refused:
            return "; ".join(o.message for o in self.outcomes.values())
        return "; ".join(o.message for o in refused.values())


def commit_run(
    state: GroupState, reports: Sequence[RangeReport], identities: Mapping[str, str] | None = None
) -> tuple[GroupState, RunCommitOutcome]:
    """Commit every range of one run, or none: a run's output covers all its ranges, so committing part of it
    would leave the rest to be processed again by a run that also redoes what was committed. ``identities``: the
    current identity of each shard's log, where known (see ``commit``)."""
    if len({r.shard for r in reports}) != len(reports):
        raise ValueError("a run holds at most one range per shard")
    if len({r.run_key for r in reports}) > 1:
        raise ValueError("the ranges of one commit must belong to one run")
    outcomes: dict[str, CommitOutcome] = {}
    new_state = state
    for report in reports:
        new_state, outcome = commit(new_state, report, (identities or {}).get(report.shard))
        outcomes[report.shard] = outcome
    if all(o.accepted for o in outcomes.values()):
        return new_state, RunCommitOutcome(accepted=True, outcomes=outcomes)
    # All or nothing: the checks of the others stand, their changes are dropped.
    return state, RunCommitOutcome(accepted=False, outcomes=outcomes)


class FailOutcome(StrEnum):
    RETRY = "retry"
    PARKED = "parked"
    DEAD_LETTERED = "dead_lettered"
    IGNORED = "ignored"


def _held_by(shard: ShardState | None, report: RangeReport) -> InFlight | None:
    """The shard's range in flight if the reporting run is the one it was launched as (run key, member and
    epoch): a stale run of the same range, relaunched since under the same key, must not act on its successor's."""
    inflight = shard.inflight if shard is not None else None
    if (
        inflight is None
        or inflight.run_key != report.run_key
        or inflight.epoch != report.epoch
        or inflight.member_id != report.member_id
    ):
        return None
    return inflight


def fail(
    state: GroupState, report: RangeReport, reason: str, now: float, policy: GroupPolicy
) -> tuple[GroupState, FailOutcome]:
    """The run of the in-flight range failed: retry the same offsets, or give the range up as configured.

    Only the run in flight may report: same run key, and the member and epoch it was launched under. A
    stale run of the same range (launched before its shard moved, and relaunched since under the same
    key) is ignored, so it cannot clear its successor's record and start a second concurrent run; a report
    already handled, or replayed, is ignored too."""
    shard = state.shards.get(report.shard)
    inflight = _held_by(shard, report)
    if shard is None or inflight is None:
        return state, FailOutcome.IGNORED
    attempts = inflight.attempt + 1
    base = evolve(shard, inflight=None, retry_end=inflight.end)
    if attempts < policy.max_attempts:
        updated = _leave_if_departed(state, evolve(base, attempt=attempts))
        return state.model_copy(update={"shards": {**state.shards, report.shard: updated}}), FailOutcome.RETRY
    detail = f"run {report.run_key} failed {attempts} time(s); last error: {reason}"
    if policy.after_max_attempts == "park":
        parked = Parked(start=report.start, end=report.end, reason=detail, at=now, cause="retries")
        updated = evolve(base, attempt=attempts, parked=parked)
        kind, outcome = EventKind.PARKED, FailOutcome.PARKED
    else:
        updated = evolve(base, attempt=0, retry_end=None, committed=max(report.end, shard.committed or 0))
        kind, outcome = EventKind.DEAD_LETTER, FailOutcome.DEAD_LETTERED
        letter = DeadLetter(
            shard=report.shard, start=report.start, end=report.end, reason=detail, at=now, run_key=report.run_key
        )
        state = state.model_copy(update={"dead_letters": (*state.dead_letters, letter)})
    updated = _leave_if_departed(state, updated)
    event = GroupEvent(
        kind=kind,
        at=now,
        shard=report.shard,
        member_id=report.member_id,
        start=report.start,
        end=report.end,
        detail=detail,
    )
    new_state = state.model_copy(update={"shards": {**state.shards, report.shard: updated}})
    return add_events(new_state, event), outcome


def unpark(state: GroupState, shard_id: str, now: float, *, skip: bool = False) -> GroupState:
    """Operator action: resume a parked shard, retrying its range, or with ``skip`` dead-lettering it.

    Resuming bumps the shard's epoch: the attempts count again from 0, and without a new epoch the retry
    would carry the run key of the range's first failed attempt, which the orchestrator keeps for good and
    would skip as a duplicate. Nothing is in flight on a parked shard, so no run is fenced out by it."""
    shard = state.shards.get(shard_id)
    if shard is None or shard.parked is None:
        return state
    parked = shard.parked
    update: dict[str, object] = {
        "parked": None,
        "attempt": 0,
        "epoch": shard.epoch + 1,
        "ahead_since": None,
        "missing_since": None,
    }
    # Skipping gives up the parked range, which starts at the committed offset (a failed range, offsets lost
    # to retention). A shard parked because the stream ends below offsets it has seen has no such range:
    # it is only resumed, and its offsets never move back.
    skip = skip and parked.start == shard.committed and parked.end > parked.start
    if skip:
        update["committed"] = max(parked.end, shard.committed or 0)
        update["retry_end"] = None
    event = GroupEvent(
        kind=EventKind.DEAD_LETTER if skip else EventKind.UNPARKED,
        at=now,
        shard=shard_id,
        start=parked.start,
        end=parked.end,
        detail=("skipped by an operator: " if skip else "unparked by an operator: ") + parked.reason,
    )
    new_state = state.model_copy(update={"shards": {**state.shards, shard_id: evolve(shard, **update)}})
    if skip:
        letter = DeadLetter(
            shard=shard_id,
            start=parked.start,
            end=parked.end,
            reason="skipped by an operator: " + parked.reason,
            at=now,
        )
        new_state = new_state.model_copy(update={"dead_letters": (*new_state.dead_letters, letter)})
    return add_events(new_state, event)


def fail_run(
    state: GroupState, reports: Sequence[RangeReport], reason: str, now: float, policy: GroupPolicy
) -> tuple[GroupState, dict[str, FailOutcome]]:
    """Every range of a failed run is retried (or given up) on its own shard, in one state write."""
    outcomes: dict[str, FailOutcome] = {}
    for report in reports:
        state, outcomes[report.shard] = fail(state, report, reason, now, policy)
    return state, outcomes


LAUNCH_BACKOFF_CAP_S = 60.0
"""The longest wait between relaunches of a range whose launches keep raising."""
LAUNCH_FAILURES_EVENT = 3
"""Launches of one range that raised in a row before the group records an event (and every 10th after it)."""


def relaunch_key(run_key: str, relaunches: int) -> str:
    """The run key of a range's ``relaunches``-th relaunch: a new key, so the orchestrator, which keeps the
    failed run's key for good, does not skip the relaunch as a duplicate."""
    return f"{re.sub(r':l[0-9]+$', '', run_key)}:l{relaunches}"


def launch_backoff_s(relaunches: int, policy: GroupPolicy) -> float:
    """Doubling from the heartbeat up to ``LAUNCH_BACKOFF_CAP_S``."""
    return float(min(LAUNCH_BACKOFF_CAP_S, policy.heartbeat_interval_s * 2 ** max(0, relaunches - 1)))


def launch_failed(
    state: GroupState, reports: Sequence[RangeReport], reason: str, now: float, policy: GroupPolicy
) -> tuple[GroupState, int]:
    """The launch of a run raised: no worker started, nothing was read, so it is not an attempt. Its ranges stay
    in flight with their bounds, under a new run key, and are requested again after a backoff; a range whose
    shard moved on meanwhile is released with its bounds for the next owner. Returns the state and the number of
    relaunches in a row (0: the report was stale and changed nothing).

    Counting it as an attempt would park or dead-letter every shard of a member through a launcher outage of a
    few ticks, and with dead letters move the committed offset past records nobody read."""
    held = [
        (r, shard)
        for r in reports
        if (shard := state.shards.get(r.shard)) is not None
        and shard.inflight is not None
        and shard.inflight.run_key == r.run_key
        and shard.inflight.epoch == r.epoch
        and shard.inflight.member_id == r.member_id
    ]
    if not held:
        return state, 0
    relaunches = max(shard.inflight.relaunches for _, shard in held if shard.inflight is not None) + 1
    backoff = launch_backoff_s(relaunches, policy)
    new_key = relaunch_key(held[0][0].run_key, relaunches)
    changed: dict[str, ShardState] = {}
    for report, shard in held:
        inflight = shard.inflight
        assert inflight is not None
        if shard.owner != report.member_id or shard.epoch != report.epoch or inflight.orphaned_at is not None:
            changed[report.shard] = _leave_if_departed(state, evolve(shard, **released_with_bounds(inflight)))
            continue
        relaunch = evolve(inflight, run_key=new_key, relaunches=relaunches, not_before=now + backoff)
        changed[report.shard] = evolve(shard, inflight=relaunch)
    new_state = state.model_copy(update={"shards": {**state.shards, **changed}})
    if relaunches == LAUNCH_FAILURES_EVENT or (relaunches > LAUNCH_FAILURES_EVENT and relaunches % 10 == 0):
        ranges = ", ".join(f"{r.shard} [{r.start}, {r.end})" for r, _ in held)
        event = GroupEvent(
            kind=EventKind.LAUNCH_FAILING,
            at=now,
            member_id=held[0][0].member_id,
            detail=f"the run of {ranges} could not be launched {relaunches} times in a row (last: {reason}); "
            f"relaunching in {backoff:g} s, no attempt counted: check the run launcher",
        )
        new_state = add_events(new_state, event)
    return new_state, relaunches


def held_back(state: GroupState, member_id: str, now: float) -> set[str]:
    """Run keys of ``member_id``'s ranges in flight that wait out a launch backoff: not requested before then."""
    return {
        s.inflight.run_key
        for s in state.shards.values()
        if s.inflight is not None
        and s.inflight.member_id == member_id
        and s.inflight.not_before is not None
        and s.inflight.not_before > now
    }


def touch(state: GroupState, reports: Sequence[RangeReport], now: float) -> GroupState:
    """A run says it is alive: each of its ranges still in flight under its identity (run key, member, epoch)
    records ``now``. Ranges it no longer holds are left alone; nothing changes is the same object."""
    changed: dict[str, ShardState] = {}
    for report in reports:
        shard = state.shards.get(report.shard)
        inflight = _held_by(shard, report)
        if shard is None or inflight is None or (inflight.alive_at is not None and inflight.alive_at >= now):
            continue
        changed[report.shard] = evolve(shard, inflight=evolve(inflight, alive_at=now))
    if not changed:
        return state
    return state.model_copy(update={"shards": {**state.shards, **changed}})


def resolve_dead_letters(state: GroupState, shard: str | None = None) -> tuple[GroupState, list[DeadLetter]]:
    """Operator action: the dead letters of ``shard`` (or all) were dealt with; they leave the state."""
    resolved = [d for d in state.dead_letters if shard is None or d.shard == shard]
    if not resolved:
        return state, []
    kept = tuple(d for d in state.dead_letters if not (shard is None or d.shard == shard))
    return state.model_copy(update={"dead_letters": kept}), resolved


def add_dead_records(
    state: GroupState, report: RangeReport, dead_records: int, records: Sequence[DeadRecord], reason: str, now: float
) -> GroupState:
    """A committed range's records that could not be decoded (``dead_records`` of them, the first ``records``
    with their raw bytes): a dead letter and an event, in the write that commits the range."""
    letter = DeadLetter(
        shard=report.shard,
        start=report.start,
        end=report.end,
        reason=reason,
        at=now,
        run_key=report.run_key,
        dead_records=dead_records,
        records=tuple(records),
    )
    event = GroupEvent(
        kind=EventKind.DEAD_LETTER,
        at=now,
        shard=report.shard,
        member_id=report.member_id,
        start=report.start,
        end=report.end,
        detail=reason,
    )
    return add_events(state.model_copy(update={"dead_letters": (*state.dead_letters, letter)}), event)


def park_now(state: GroupState, report: RangeReport, reason: str, now: float) -> tuple[GroupState, FailOutcome]:
    """The run of the in-flight range met records that a retry would meet again (a writer schema the reader
    cannot resolve, an undecodable record under ``on_decode_error: fail``): the range is parked at once, with an
    event, without spending the retries. Only the run in flight may report, as for ``fail``."""
    shard = state.shards.get(report.shard)
    inflight = _held_by(shard, report)
    if shard is None or inflight is None:
        return state, FailOutcome.IGNORED
    detail = f"run {report.run_key}: {reason}"
    parked = Parked(start=report.start, end=report.end, reason=detail, at=now)
    updated = _leave_if_departed(
        state, evolve(shard, inflight=None, retry_end=inflight.end, attempt=inflight.attempt + 1, parked=parked)
    )
    event = GroupEvent(
        kind=EventKind.PARKED,
        at=now,
        shard=report.shard,
        member_id=report.member_id,
        start=report.start,
        end=report.end,
        detail=detail,
    )
    new_state = state.model_copy(update={"shards": {**state.shards, report.shard: updated}})
    return add_events(new_state, event), FailOutcome.PARKED
