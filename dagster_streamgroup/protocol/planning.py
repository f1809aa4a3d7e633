"""Planning the next bounded range of each owned, idle shard, and discovering shards.

A planned range is recorded in flight *before* its run is requested, so a member that crashes between the
CAS write and the launch request re-requests the same range (same run key) on its next tick instead of
losing or doubling it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from dagster_streamgroup.protocol.lifecycle import in_scope
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
    """The group's offset as the stream itself records it (Kafka's group offsets, the v3io shard attribute), in
    the shard's current log. For a shard not positioned yet, a group whose state was lost or moved (a new store,
    a changed bootstrap list) resumes where the stream says it was, like a Kafka consumer, and only a group the
    stream has never seen follows the seek policy. For a positioned shard, it is how a reset made around the group
    (Kafka's consumer-groups tool) is seen."""
    mirror_foreign: bool = False
    """``group_committed`` was not written by this group's members (Kafka: no marker of ours in the commit's
    metadata): an operator's tool, another application, a version of ours before the marker."""
    identity: str | None = None
    """The identity of the shard's log these watermarks were read from (a Kafka topic's id), where known."""
    at_timestamp: int | None = None
    """Under ``seek='timestamp'``, for a shard not positioned yet: the first offset at or after the policy's
    timestamp (the high watermark if no record is that recent)."""
    uncommitted_high: int | None = None
    """Past ``high`` while an open transaction holds readers at the last stable offset: what was written.
    Planning never goes past ``high``; lag counts to this."""


class Launch(BaseModel):
    """One range to run: everything a run needs to read its records and to present its commit.

    The ranges of one run share its ``run_key``; a shard has at most one range in flight."""

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


def run_key(group: str, shard: str, start: int, end: int, attempt: int, epoch: int | None = None) -> str:
    """The key of a run over one range: deterministic, so a re-request of the same range, attempt and epoch is
    deduplicated by the orchestrator, and a relaunch under a new epoch (the shard moved and came back) is not."""
    key = f"{group}:{shard}:{start}-{end}:a{attempt}"
    return key if epoch is None else f"{key}:e{epoch}"


def batch_run_key(group: str, member_id: str, ranges: Sequence[tuple[str, int, int, int, int]]) -> str:
    """The key of a run over several ranges ``(shard, start, end, attempt, epoch)``: one range gives the
    single-range key; more give ``<group>:<member>:<n>r:<digest>`` over all of them, so any change of a range,
    an attempt or an epoch is a new key."""
    if len(ranges) == 1:
        shard, start, end, attempt, epoch = ranges[0]
        return run_key(group, shard, start, end, attempt, epoch)
    text = ";".join(f"{s}:{a}-{b}:a{n}:e{e}" for s, a, b, n, e in sorted(ranges))
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    return f"{group}:{member_id}:{len(ranges)}r:{digest}"


def runs_of(launches: Iterable[Launch]) -> dict[str, list[Launch]]:
    """Launches grouped by run, in the order their runs first appear, each run's ranges in shard order."""
    runs: dict[str, list[Launch]] = {}
    for launch in launches:
        runs.setdefault(launch.run_key, []).append(launch)
    return {key: sorted(ranges, key=lambda x: x.shard) for key, ranges in runs.items()}


def sync_shards(state: GroupState, shard_ids: Iterable[str], now: float) -> GroupState:
    """Add shards the stream has now. Shards are never removed: their offsets are the group's memory.

    Shards found after the group was created are ``late``: they start at the earliest offset whatever the
    seek policy, so the first records of a new partition are not skipped."""
    new = [s for s in shard_ids if s not in state.shards]
    if not new:
        return state
    late = bool(state.shards)
    shards = dict(state.shards)
    for shard_id in new:
        shards[shard_id] = ShardState(discovered_at=now, late=late)
    return state.model_copy(update={"shards": shards})


@dataclass(frozen=True)
class _Ready:
    """A positioned, idle shard and what it could read now."""

    shard_id: str
    shard: ShardState
    start: int
    retry_end: int | None
    backlog: int


def plan(
    state: GroupState,
    member_id: str,
    now: float,
    watermarks: Mapping[str, Watermark],
    policy: GroupPolicy,
) -> tuple[GroupState, list[Launch]]:
    """Position, check retention, and launch the next ranges of the idle shards ``member_id`` owns (those no
    backfill holds a lease on).

    In member mode the new ranges of one tick form one run, sized by the backlog; a retry runs alone, so a
    range that keeps failing is parked on its own and never takes healthy shards down with it. Shards missing
    from ``watermarks`` (the backend did not answer for them) are left for the next tick."""
    if member_id not in state.members:
        return state, []
    shards: dict[str, ShardState] = {}
    events: list[GroupEvent] = []
    ready: list[_Ready] = []
    scope = state.members[member_id].scope
    for shard_id, shard in state.shards.items():
        if shard.owner != member_id or shard.inflight is not None or shard.parked is not None or shard.removed:
            continue
        if shard.lease is not None:  # a backfill holds the shard, or waits for its range in flight (lease.py)
            continue
        mark = watermarks.get(shard_id)
        if mark is None or not in_scope(scope, shard_id):
            continue
        if mark.identity is not None and shard.identity is not None and mark.identity != shard.identity:
            continue  # read from another log than the state's: the next tick's sync_log tells which
        updated, candidate, event = _position(shard_id, shard, member_id, now, mark, policy)
        if updated is not shard:
            shards[shard_id] = updated
        if event is not None:
            events.append(event)
        if candidate is not None:
            ready.append(candidate)
    chosen: list[list[tuple[_Ready, int]]] = []
    if policy.run_mode == "shard":
        for candidate in ready:
            end = _shard_mode_end(candidate, now, policy, shards)
            if end is not None:
                chosen.append([(candidate, end)])
    else:
        chosen = _member_mode_runs(ready, now, policy, shards)
    launches: list[Launch] = []
    for run in chosen:
        key = batch_run_key(
            state.group,
            member_id,
            [(c.shard_id, c.start, end, c.shard.attempt, c.shard.epoch) for c, end in run],
        )
        for candidate, end in run:
            shard = shards.get(candidate.shard_id, candidate.shard)
            launch = Launch(
                group=state.group,
                shard=candidate.shard_id,
                start=candidate.start,
                end=end,
                attempt=shard.attempt,
                epoch=shard.epoch,
                member_id=member_id,
                run_key=key,
            )
            inflight = InFlight(
                start=launch.start,
                end=end,
                attempt=launch.attempt,
                run_key=key,
                epoch=launch.epoch,
                member_id=member_id,
                launched_at=now,
            )
            shards[candidate.shard_id] = evolve(shard, inflight=inflight, backlog_since=None)
            launches.append(launch)
    if not shards:
        return add_events(state, *events), launches
    return add_events(state.model_copy(update={"shards": {**state.shards, **shards}}), *events), launches


def _shard_mode_end(candidate: _Ready, now: float, policy: GroupPolicy, shards: dict[str, ShardState]) -> int | None:
    """One run per shard range: a retry as it was, else once ``min_backlog`` records wait or a smaller
    backlog has waited ``max_wait_s``."""
    if candidate.retry_end is not None:
        return candidate.retry_end
    shard = shards.get(candidate.shard_id, candidate.shard)
    if candidate.backlog < policy.min_backlog:
        if shard.backlog_since is None:
            shards[candidate.shard_id] = evolve(shard, backlog_since=now)
            return None
        if now - shard.backlog_since < policy.max_wait_s:
            return None
    return candidate.start + min(candidate.backlog, policy.max_records_per_run)


def _member_mode_runs(
    ready: list[_Ready], now: float, policy: GroupPolicy, shards: dict[str, ShardState]
) -> list[list[tuple[_Ready, int]]]:
    """Every retry of a failed range alone, then one run over the ranges handed over with their bounds (at once:
    they were launched before) and the fresh backlog of all ready shards once ``min_backlog`` records wait in all
    or one shard's backlog has waited ``max_wait_s``; what the bounded ranges leave of its budget is split by
    backlog."""
    failed = [c for c in ready if c.retry_end is not None and c.shard.attempt > 0]
    runs: list[list[tuple[_Ready, int]]] = [[(c, c.retry_end)] for c in failed if c.retry_end is not None]
    bounded = [(c, c.retry_end) for c in ready if c.retry_end is not None and c.shard.attempt == 0]
    fresh = [c for c in ready if c.retry_end is None]
    waited = 0.0
    for candidate in fresh:
        shard = shards.get(candidate.shard_id, candidate.shard)
        if shard.backlog_since is None:
            shards[candidate.shard_id] = evolve(shard, backlog_since=now)
        else:
            waited = max(waited, now - shard.backlog_since)
    run = list(bounded)
    if fresh and (sum(c.backlog for c in fresh) >= policy.min_backlog or waited >= policy.max_wait_s):
        left = max(0, policy.max_records_per_run - sum(end - c.start for c, end in bounded))
        shares = split_budget({c.shard_id: c.backlog for c in fresh}, left)
        run += [(c, c.start + shares[c.shard_id]) for c in fresh if shares[c.shard_id] > 0]
    if run:
        runs.append(run)
    return runs


def split_budget(backlogs: Mapping[str, int], budget: int) -> dict[str, int]:
    """Records per shard for one run: every backlog whole if the budget allows, else shares in proportion to
    the backlogs (largest remainders first), so the shards furthest behind catch up fastest and all of them
    reach the stream's end together. The shares add up to at most ``budget``."""
    total = sum(backlogs.values())
    if total <= budget:
        return dict(backlogs)
    exact = {sid: budget * n / total for sid, n in backlogs.items()}
    shares = {sid: int(x) for sid, x in exact.items()}
    left = budget - sum(shares.values())
    for sid in sorted(exact, key=lambda s: (shares[s] - exact[s], s))[:left]:
        shares[sid] += 1
    return shares


def _position(
    shard_id: str,
    shard: ShardState,
    member_id: str,
    now: float,
    mark: Watermark,
    policy: GroupPolicy,
) -> tuple[ShardState, _Ready | None, GroupEvent | None]:
    """Where an idle shard stands: positioned (group offset, then seek policy), retention checked, offsets
    past the stream's end held back. Returns what it could read now, or ``None``."""
    event: GroupEvent | None = None
    committed = shard.committed
    if committed is None:
        start = _initial_offset(shard, mark, policy)
        if start is None:
            return shard, None, None
        committed = start
        shard = evolve(shard, committed=committed, identity=shard.identity or mark.identity)
        if mark.group_committed is not None and mark.mirror_foreign:
            event = _adopted(shard_id, member_id, now, committed)
    elif mark.group_committed is not None and mark.mirror_foreign and mark.group_committed != committed:
        event = _reset_refused(shard_id, member_id, now, mark.group_committed, committed)
    if committed < mark.low:
        lost = f"offsets [{committed}, {mark.low}) fell out of retention before they were processed"
        if policy.on_data_loss == "fail":
            parked = Parked(start=committed, end=mark.low, reason=lost, at=now, cause="data_loss")
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
    if seen > mark.high and mark.uncommitted_high is not None and seen <= mark.uncommitted_high:
        # Written, and held back by an open transaction (the log start may pass the last stable offset: records
        # deleted inside the transaction): nothing to read until it ends, and nothing is past the stream's end.
        if shard.ahead_since is not None:
            shard = evolve(shard, ahead_since=None)
        return shard, None, event
    if seen > mark.high:
        updated, event_ahead = _offsets_ahead(shard_id, shard, member_id, now, mark, policy, seen)
        return updated, None, event_ahead or event
    if shard.ahead_since is not None:
        shard = evolve(shard, ahead_since=None)
    backlog = mark.high - committed
    if retry_end is None and backlog <= 0:
        if shard.backlog_since is not None:
            shard = evolve(shard, backlog_since=None)
        return shard, None, event
    return shard, _Ready(shard_id, shard, committed, retry_end, backlog), event


def _adopted(shard_id: str, member_id: str, now: float, offset: int) -> GroupEvent:
    detail = (
        f"shard {shard_id} starts at offset {offset}: the stream's record of the group's offset holds it, written by "
        "something other than this group's members (Kafka's consumer-groups tool, a v3io shard's committed-sequence "
        "attribute set by hand, another application, or a version before the members marked their commits); the group "
        "had no position of its own (a new or lost state)"
    )
    return GroupEvent(kind=EventKind.ADOPTED, at=now, shard=shard_id, member_id=member_id, start=offset, detail=detail)


def _reset_refused(shard_id: str, member_id: str, now: float, offset: int, committed: int) -> GroupEvent:
    detail = (
        f"the stream's record of the group's offset of shard {shard_id} was set to {offset} by something other than "
        f"this group's members (e.g. kafka-consumer-groups --reset-offsets, or a v3io shard's committed-sequence "
        "attribute set by hand, Nuclio's way to replay): not applied, the group goes on from "
        f"{committed} and the record is restored to it. The group's offsets live in its state, where every move is "
        "fenced against the runs in flight: move the group with `streamgroup reset`"
    )
    return GroupEvent(
        kind=EventKind.RESET_REFUSED,
        at=now,
        shard=shard_id,
        member_id=member_id,
        start=min(offset, committed),
        end=max(offset, committed),
        detail=detail,
    )


def _initial_offset(shard: ShardState, mark: Watermark, policy: GroupPolicy) -> int | None:
    """The first offset of a shard the group has not positioned: the group's offset as the stream records
    it, else the seek policy (a shard found after the group started always from its earliest offset)."""
    if mark.group_committed is not None:
        return mark.group_committed
    if policy.seek == "earliest" or shard.late:
        return mark.low
    if policy.seek == "latest":
        return mark.high
    if mark.at_timestamp is None:
        return None  # the member did not look the timestamp up: position next tick
    return min(max(mark.at_timestamp, mark.low), mark.high)


def _offsets_ahead(
    shard_id: str,
    shard: ShardState,
    member_id: str,
    now: float,
    mark: Watermark,
    policy: GroupPolicy,
    seen: int,
) -> tuple[ShardState, GroupEvent | None]:
    """The stream ends below an offset the group has seen (its committed offset, or the end of a failed range
    to retry): the stream was recreated or truncated, or (briefly) a new Kafka leader has not caught up its
    high watermark yet. Reading on would skip whatever the stream now holds below that offset, or wait for
    records that are gone, and moving the offset back is not ours to decide, so nothing is launched; if it
    lasts a session timeout, the shard is parked with an event."""
    if shard.ahead_since is None:
        return evolve(shard, ahead_since=now), None
    if now - shard.ahead_since < policy.session_timeout_s:
        return shard, None
    detail = (
        f"the stream's high watermark {mark.high} is below offset {seen}, which this group has seen "
        f"(committed {shard.committed}), since {now - shard.ahead_since:.0f} s: the stream was recreated or "
        "truncated; shard parked, nothing was read or skipped (resume it with `streamgroup unpark` once the "
        "stream is past the offset again, or consume the new stream under another group)"
    )
    parked = Parked(start=mark.high, end=seen, reason=detail, at=now, cause="offsets_ahead")
    event = GroupEvent(
        kind=EventKind.OFFSETS_AHEAD,
        at=now,
        shard=shard_id,
        member_id=member_id,
        start=mark.high,
        end=seen,
        detail=detail,
    )
    return evolve(shard, parked=parked, ahead_since=None), event


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


def waiting_behind_inflight(state: GroupState, member_id: str, highs: Mapping[str, int]) -> int:
    """Records already in the stream (``highs``: each shard's high watermark) past the ends of ``member_id``'s
    ranges in flight: what it could launch the moment those runs commit (shards missing count none)."""
    return sum(
        max(0, highs[launch.shard] - launch.end)
        for launch in inflight_launches(state, member_id)
        if launch.shard in highs
    )


def runs_still_inflight(state: GroupState | None, member_id: str, run_keys: Iterable[str]) -> set[str]:
    """The runs of ``run_keys`` that still hold a range in flight under ``member_id`` (none once it left)."""
    if state is None:
        return set()
    wanted = set(run_keys)
    return {launch.run_key for launch in inflight_launches(state, member_id) if launch.run_key in wanted}
