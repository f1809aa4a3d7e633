"""Planning the next bounded range of each owned, idle shard, and discovering shards.

A planned range is recorded in flight *before* its run is requested, so a member that crashes between the
CAS write and the launch request re-requests the same range (same run key) on its next tick instead of
losing or doubling it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pydantic import BaseModel, ConfigDict

from dagster_streamgroup.protocol.membership import add_events
from dagster_streamgroup.protocol.policy import GroupPolicy
from dagster_streamgroup.protocol.state import (
    EventKind,
    GroupEvent,
    GroupState,
    InFlight,
    Parked,
    ShardState,
    evolve,
)


class Watermark(BaseModel):
    model_config = ConfigDict(frozen=True)
    low: int
    high: int
    group_committed: int | None = None
    """The group's offset as the stream itself records it (Kafka's group offsets, the v3io shard attribute),
    given for a shard not positioned yet: a group whose state was lost or moved (a new store, a changed
    bootstrap list) resumes where the stream says it was, like a Kafka consumer, and only a group the stream
    has never seen follows the seek policy."""


class Launch(BaseModel):
    """One range to run: everything a run needs to read its records and to present its commit."""

    model_config = ConfigDict(frozen=True)
    group: str
    shard: str
    start: int
    end: int
    attempt: int
    epoch: int
    member_id: str
    run_key: str

    @property
    def records(self) -> int:
        return self.end - self.start


def run_key(group: str, shard: str, start: int, end: int, attempt: int) -> str:
    """Deterministic, so a re-request of the same range and attempt is deduplicated by the orchestrator."""
    return f"{group}:{shard}:{start}-{end}:a{attempt}"


def sync_shards(
    state: GroupState,
    shard_ids: Iterable[str],
    now: float,
    predecessors: Mapping[str, frozenset[str]] | None = None,
) -> GroupState:
    """Add shards the stream has now. Shards are never removed: their offsets are the group's memory.

    Shards found after the group was created are ``late``: they start at the earliest offset whatever the
    seek policy, so the first records of a new partition are not skipped. ``predecessors`` gates a
    successor until the shards it continues are read to their end (split/merge)."""
    new = [s for s in shard_ids if s not in state.shards]
    if not new:
        return state
    late = bool(state.shards)
    gates = predecessors or {}
    shards = dict(state.shards)
    for shard_id in new:
        pending = frozenset(p for p in gates.get(shard_id, frozenset()) if p != shard_id)
        shards[shard_id] = ShardState(discovered_at=now, late=late, pending_predecessors=pending)
    return state.model_copy(update={"shards": shards})


def complete_shard(state: GroupState, shard_id: str) -> GroupState:
    """A sealed shard was read to its end: successors waiting on it may now be claimed."""
    changed = {
        sid: evolve(shard, pending_predecessors=shard.pending_predecessors - {shard_id})
        for sid, shard in state.shards.items()
        if shard_id in shard.pending_predecessors
    }
    if not changed:
        return state
    return state.model_copy(update={"shards": {**state.shards, **changed}})


def plan(
    state: GroupState,
    member_id: str,
    now: float,
    watermarks: Mapping[str, Watermark],
    policy: GroupPolicy,
) -> tuple[GroupState, list[Launch]]:
    """Position, check retention, and launch the next range of every idle shard ``member_id`` owns.

    Shards missing from ``watermarks`` (the backend did not answer for them) are left for the next tick."""
    if member_id not in state.members:
        return state, []
    shards: dict[str, ShardState] | None = None
    events: list[GroupEvent] = []
    launches: list[Launch] = []
    for shard_id, shard in state.shards.items():
        if shard.owner != member_id or shard.inflight is not None or shard.parked is not None:
            continue
        mark = watermarks.get(shard_id)
        if mark is None:
            continue
        updated, launch, event = _plan_shard(state.group, shard_id, shard, member_id, now, mark, policy)
        if updated is not shard:
            if shards is None:
                shards = dict(state.shards)
            shards[shard_id] = updated
        if launch is not None:
            launches.append(launch)
        if event is not None:
            events.append(event)
    if shards is None:
        return state, launches
    return add_events(state.model_copy(update={"shards": shards}), *events), launches


def _plan_shard(
    group: str,
    shard_id: str,
    shard: ShardState,
    member_id: str,
    now: float,
    mark: Watermark,
    policy: GroupPolicy,
) -> tuple[ShardState, Launch | None, GroupEvent | None]:
    event: GroupEvent | None = None
    committed = shard.committed
    if committed is None:
        if mark.group_committed is not None:
            committed = mark.group_committed
        else:
            committed = mark.low if (policy.seek == "earliest" or shard.late) else mark.high
        shard = evolve(shard, committed=committed)
    if committed < mark.low:
        lost = f"offsets [{committed}, {mark.low}) fell out of retention before they were processed"
        if policy.on_data_loss == "fail":
            parked = Parked(start=committed, end=mark.low, reason=lost, at=now)
            event = GroupEvent(
                kind=EventKind.DATA_LOSS,
                at=now,
                shard=shard_id,
                member_id=member_id,
                start=committed,
                end=mark.low,
                detail=lost + "; shard parked (on_data_loss=fail)",
            )
            return evolve(shard, parked=parked), None, event
        event = GroupEvent(
            kind=EventKind.DATA_LOSS,
            at=now,
            shard=shard_id,
            member_id=member_id,
            start=committed,
            end=mark.low,
            detail=lost + "; skipped to the earliest offset (on_data_loss=earliest)",
        )
        committed = mark.low
        shard = evolve(shard, committed=committed)
    retry_end = shard.retry_end if shard.retry_end is not None and shard.retry_end > committed else None
    if retry_end is None and shard.retry_end is not None:
        shard = evolve(shard, retry_end=None)  # retention loss skipped past the failed range
    seen = max(committed, retry_end or 0)  # the failed range's records existed when it was planned
    if seen > mark.high:
        return _offsets_ahead(shard_id, shard, member_id, now, mark, policy, seen)
    if shard.ahead_since is not None:
        shard = evolve(shard, ahead_since=None)
    backlog = mark.high - committed
    if retry_end is not None:
        end = retry_end  # the failed range again, however much the backlog has grown
    else:
        if backlog <= 0:
            if shard.backlog_since is not None:
                shard = evolve(shard, backlog_since=None)
            return shard, None, event
        if backlog < policy.min_backlog:
            if shard.backlog_since is None:
                return evolve(shard, backlog_since=now), None, event
            if now - shard.backlog_since < policy.max_wait_s:
                return shard, None, event
        end = committed + min(backlog, policy.max_records_per_run)
    key = run_key(group, shard_id, committed, end, shard.attempt)
    inflight = InFlight(
        start=committed,
        end=end,
        attempt=shard.attempt,
        run_key=key,
        epoch=shard.epoch,
        member_id=member_id,
        launched_at=now,
    )
    launch = Launch(
        group=group,
        shard=shard_id,
        start=committed,
        end=end,
        attempt=shard.attempt,
        epoch=shard.epoch,
        member_id=member_id,
        run_key=key,
    )
    return evolve(shard, inflight=inflight, backlog_since=None), launch, event


def _offsets_ahead(
    shard_id: str,
    shard: ShardState,
    member_id: str,
    now: float,
    mark: Watermark,
    policy: GroupPolicy,
    seen: int,
) -> tuple[ShardState, Launch | None, GroupEvent | None]:
    """The stream ends below an offset the group has seen (its committed offset, or the end of a failed range
    to retry): the stream was recreated or truncated, or (briefly) a new Kafka leader has not caught up its
    high watermark yet. Reading on would skip whatever the stream now holds below that offset, or wait for
    records that are gone, and moving the offset back is not ours to decide, so nothing is launched; if it
    lasts a session timeout, the shard is parked with an event."""
    if shard.ahead_since is None:
        return evolve(shard, ahead_since=now), None, None
    if now - shard.ahead_since < policy.session_timeout_s:
        return shard, None, None
    detail = (
        f"the stream's high watermark {mark.high} is below offset {seen}, which this group has seen "
        f"(committed {shard.committed}), since {now - shard.ahead_since:.0f} s: the stream was recreated or "
        "truncated; shard parked, nothing was read or skipped (resume it with `streamgroup unpark` once the "
        "stream is past the offset again, or consume the new stream under another group)"
    )
    parked = Parked(start=mark.high, end=seen, reason=detail, at=now)
    event = GroupEvent(
        kind=EventKind.OFFSETS_AHEAD,
        at=now,
        shard=shard_id,
        member_id=member_id,
        start=mark.high,
        end=seen,
        detail=detail,
    )
    return evolve(shard, parked=parked, ahead_since=None), None, event


def inflight_launches(state: GroupState, member_id: str) -> list[Launch]:
    """Every range in flight under ``member_id``: requested until its run exists, under the same run key."""
    return [
        Launch(
            group=state.group,
            shard=shard_id,
            start=s.inflight.start,
            end=s.inflight.end,
            attempt=s.inflight.attempt,
            epoch=s.inflight.epoch,
            member_id=s.inflight.member_id,
            run_key=s.inflight.run_key,
        )
        for shard_id, s in state.shards.items()
        if s.inflight is not None and s.owner == member_id and s.inflight.member_id == member_id
    ]
