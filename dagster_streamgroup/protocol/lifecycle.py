"""The stream's own life under the group: a shard's log recreated, a part of the stream missing or no longer
consumed, and an operator moving shards. Pure transitions, as the rest of the protocol.

The protocol knows a stream only through what a member's backend lists (``StreamView``): its shards, the
*identity* of each shard's log where the backend has one (a Kafka topic's id, which changes when the topic is
deleted and created again), and which *parts* of the stream (Kafka topics: the shard id before its last ``:``)
the member consumes and which of them do not exist now. An identity that changes means the offsets count in a
new log: whatever the old offsets were, they say nothing about the new log, so the shard starts over there (or
waits for an operator), with an event naming what the old log held unread, and ranges planned over the old log
can no longer commit. A backend without identities (``None``) keeps the old behaviour: offsets past the log's
end park the shard after a session timeout (``planning._offsets_ahead``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from pydantic import BaseModel, ConfigDict, Field

from dagster_streamgroup.protocol.membership import add_events
from dagster_streamgroup.protocol.policy import GroupPolicy
from dagster_streamgroup.protocol.state import (
    EventKind,
    GroupEvent,
    GroupState,
    Parked,
    Repositioned,
    ShardState,
    evolve,
    handed_over,
)


class StreamView(BaseModel):
    """What one member's backend lists of the stream at a tick."""

    model_config = ConfigDict(frozen=True)
    shards: tuple[str, ...]
    """The shards that exist now, of the parts this member consumes."""
    parts: tuple[str, ...] | None = None
    """The parts this member consumes (its configuration's list); ``None``: the whole stream."""
    identities: dict[str, str] = Field(default_factory=dict)
    """The identity of each part's log (or of a shard's own, keyed by shard id), where the backend has one."""
    missing: frozenset[str] = frozenset()
    """Parts this member consumes that do not exist now (a deleted topic)."""


def part_of(shard_id: str) -> str:
    """The part of the stream a shard belongs to: its id up to the last ``:`` (a Kafka topic); ``""`` (the stream
    as a whole) for an id without one (a v3io shard number)."""
    return shard_id.rpartition(":")[0]


def in_scope(scope: tuple[str, ...] | None, shard_id: str) -> bool:
    return scope is None or part_of(shard_id) in scope


def identity_of(view: StreamView, shard_id: str) -> str | None:
    return view.identities.get(shard_id) or view.identities.get(part_of(shard_id))


def served_parts(state: GroupState) -> frozenset[str] | None:
    """The parts some live member consumes; ``None`` when one consumes the whole stream (or no member is left)."""
    parts: set[str] = set()
    for member in state.members.values():
        if member.scope is None:
            return None
        parts.update(member.scope)
    return frozenset(parts) if state.members else None


def add_shards(state: GroupState, view: StreamView, now: float) -> GroupState:
    """Shards the stream has now that the state does not, with their log's identity. As ``sync_shards``: shards
    found after the group was created are ``late`` (read from their first offset whatever the seek policy)."""
    new = [s for s in view.shards if s not in state.shards]
    if not new:
        return state
    late = bool(state.shards)
    shards = dict(state.shards)
    for shard_id in new:
        shards[shard_id] = ShardState(discovered_at=now, late=late, identity=identity_of(view, shard_id))
    return state.model_copy(update={"shards": shards})


def sync_scope(state: GroupState, now: float) -> GroupState:
    """Shards of parts no live member consumes any more are ``removed`` (with an event) and released once nothing
    is in flight on them (a run in flight still commits, and counts); a part listed again is consumed again from
    its committed offsets. A shard whose owner no longer lists its part is released when idle (``rebalance``)."""
    served = served_parts(state)
    shards: dict[str, ShardState] = {}
    events: list[GroupEvent] = []
    for shard_id, shard in state.shards.items():
        unserved = served is not None and part_of(shard_id) not in served
        updated = shard
        if unserved and not shard.removed:
            part = part_of(shard_id)
            events.append(
                GroupEvent(
                    kind=EventKind.REMOVED,
                    at=now,
                    shard=shard_id,
                    start=shard.committed,
                    detail=f"{part!r} is on no member's list any more: the group stops consuming shard {shard_id}"
                    + (", once its run in flight ends (its commit counts)" if shard.inflight is not None else "")
                    + f"; its committed offset {shard.committed} is kept, for the list to take it up again",
                )
            )
            updated = evolve(shard, removed=True)
        elif not unserved and shard.removed:
            updated = evolve(shard, removed=False)
        if updated.removed and updated.owner is not None and updated.inflight is None:
            updated = handed_over(updated, None, backlog_since=None)
        if updated is not shard:
            shards[shard_id] = updated
    if not shards:
        return state
    return add_events(state.model_copy(update={"shards": {**state.shards, **shards}}), *events)


def sync_log(state: GroupState, view: StreamView, member_id: str, now: float, policy: GroupPolicy) -> GroupState:
    """The shards of the parts ``view`` lists, against what the backend says of their logs now: a missing part
    parks its shards once it has been missing for a session timeout (a part that comes back with the same identity
    resumes them); a new identity is a recreated log (``recreated``); a shard not positioned yet, or of a state
    that kept no identity, takes the current one silently, unless a shard of its part (on v3io: of the stream) with
    an identity was recreated in the same listing: a stream is deleted and created again as a whole, so a shard
    positioned before its log had an identity (an empty v3io shard has none) went with it, and the records its old
    log received since are named by an event rather than skipped."""
    shards: dict[str, ShardState] = {}
    events: list[GroupEvent] = []
    members = state.members
    recreated_parts = _recreated_parts(state, view)
    for shard_id, shard in state.shards.items():
        if shard.removed or not in_scope(view.parts, shard_id):
            continue
        part = part_of(shard_id)
        updated, event = shard, None
        if part in view.missing:
            updated, event = _missing(shard_id, shard, part, member_id, now, policy)
        else:
            if shard.missing_since is not None:
                updated = evolve(updated, missing_since=None)
            identity = identity_of(view, shard_id)
            if _log_gone(view, shard_id, updated, identity):
                updated, event = recreated(shard_id, updated, None, members, member_id, now, policy)
            elif identity is not None and updated.identity != identity:
                if updated.committed is None or (updated.identity is None and part not in recreated_parts):
                    updated = evolve(updated, identity=identity)
                else:
                    updated, event = recreated(shard_id, updated, identity, members, member_id, now, policy)
            elif updated.parked is not None and updated.parked.cause == "missing":
                updated, event = _back(shard_id, updated, part, member_id, now)
        if updated is not shard:
            shards[shard_id] = updated
        if event is not None:
            events.append(event)
    if not shards:
        return state
    return add_events(state.model_copy(update={"shards": {**state.shards, **shards}}), *events)


def _recreated_parts(state: GroupState, view: StreamView) -> frozenset[str]:
    """The parts (``""``: a v3io stream as a whole) of which the listing shows a shard with a known identity that
    changed or whose log is gone."""
    parts = set()
    for shard_id, shard in state.shards.items():
        part = part_of(shard_id)
        if shard.removed or shard.identity is None or shard.committed is None or part in view.missing:
            continue
        if not in_scope(view.parts, shard_id):
            continue
        identity = identity_of(view, shard_id)
        if (identity is not None and identity != shard.identity) or _log_gone(view, shard_id, shard, identity):
            parts.add(part)
    return frozenset(parts)


def _log_gone(view: StreamView, shard_id: str, shard: ShardState, identity: str | None) -> bool:
    """A shard whose log had an identity of its own and that the stream no longer has, while the stream itself
    exists: its log is gone. On v3io (identities per shard, shard counts that only grow) the stream was deleted and
    created again with fewer shards; without this, the old log's unread records would be dropped with no event
    (and the shard read from the old offset if the stream grew back to it). Kafka's identities are per topic, so a
    partition gone with its topic's recreation is told by the topic's new identity instead. Told only once a shard
    of the stream lists an identity of its own (a listing with none says nothing of how its logs are named)."""
    return (
        identity is None
        and shard.identity is not None
        and shard.committed is not None
        and shard_id not in view.shards
        and part_of(shard_id) not in view.identities
        and any(s in view.identities for s in view.shards if part_of(s) == part_of(shard_id))
    )


def _missing(
    shard_id: str, shard: ShardState, part: str, member_id: str, now: float, policy: GroupPolicy
) -> tuple[ShardState, GroupEvent | None]:
    if shard.missing_since is None:
        return evolve(shard, missing_since=now), None
    if shard.parked is not None or now - shard.missing_since < policy.session_timeout_s:
        return shard, None
    reason = (
        f"{part!r} does not exist (since {now - shard.missing_since:.0f} s: deleted?): shard {shard_id} parked at its "
        f"committed offset {shard.committed}; the other shards go on. It resumes by itself if {part!r} comes back "
        "as it was; a topic created again under the name is a new log (see on_recreated)"
    )
    at = shard.committed if shard.committed is not None else 0
    parked = Parked(start=at, end=at, reason=reason, at=now, cause="missing")
    event = GroupEvent(kind=EventKind.MISSING, at=now, shard=shard_id, member_id=member_id, start=at, detail=reason)
    return evolve(shard, parked=parked), event


def _back(shard_id: str, shard: ShardState, part: str, member_id: str, now: float) -> tuple[ShardState, GroupEvent]:
    """A part that was missing is there again with the same identity (a broker's incomplete answer, not a
    deletion): its shards resume where they were."""
    detail = f"{part!r} exists again, the same log as before: shard {shard_id} resumes at {shard.committed}"
    event = GroupEvent(kind=EventKind.UNPARKED, at=now, shard=shard_id, member_id=member_id, detail=detail)
    return evolve(shard, parked=None, epoch=shard.epoch + 1, attempt=0), event


def _reposition(shard: ShardState, members: Collection[str], now: float, cause: str, **changes: object) -> ShardState:
    """The shard at a position that no run's commit made: a new epoch fences every range planned before (refused
    for ``cause``), and what concerned the old position (a range to retry, an observation of the log's end, a
    commit to recognise as replayed) goes."""
    epoch = shard.epoch + 1
    owner = shard.owner if shard.owner in members else None
    return evolve(
        shard,
        owner=owner,
        epoch=epoch,
        inflight=None,
        attempt=0,
        retry_end=None,
        ahead_since=None,
        backlog_since=None,
        missing_since=None,
        last_run_key=None,
        last_commit_member=None,
        last_commit_epoch=None,
        repositioned=Repositioned(epoch=epoch, cause=cause, at=now),
        **changes,
    )


def recreated(
    shard_id: str,
    shard: ShardState,
    identity: str | None,
    members: Collection[str],
    member_id: str,
    now: float,
    policy: GroupPolicy,
) -> tuple[ShardState, GroupEvent]:
    """The shard's log was recreated: nothing of the old log is read any more (it is gone), nothing of the new one
    is skipped. Under ``on_recreated="park"`` the shard waits for an operator; under ``"earliest"`` the new log is
    read from its first offset (the group's offset in the stream, where it has one for the new log). ``identity``
    ``None``: the shard is gone with its log (a new log of the shard, if it comes, is read from its start)."""
    committed = shard.committed
    seen = max(committed or 0, shard.retry_end or 0, shard.inflight.end if shard.inflight is not None else 0)
    what = "was deleted and created again" if identity is not None else "was deleted (the stream has no such shard now)"
    detail = (
        f"the log of shard {shard_id} {what} (identity {shard.identity} -> {identity or 'none'}): "
        f"offsets {committed} and on of the old log were not read"
        + (f" (it held at least [{committed}, {seen}))" if seen > (committed or 0) else "")
    )
    if shard.inflight is not None:
        detail += f"; the range [{shard.inflight.start}, {shard.inflight.end}) in flight is fenced (its commit refused)"
    parked = None
    if policy.on_recreated == "park":
        detail += (
            "; shard parked (on_recreated=park): `streamgroup unpark` reads the new log from its first record, "
            "`streamgroup reset` starts it elsewhere"
        )
        parked = Parked(start=0, end=0, reason=detail, at=now, cause="recreated")
    else:
        detail += "; the new log is read from its first record (on_recreated=earliest)"
    updated = _reposition(shard, members, now, "recreated", identity=identity, committed=None, late=True, parked=parked)
    event = GroupEvent(
        kind=EventKind.RECREATED, at=now, shard=shard_id, member_id=member_id, start=committed, detail=detail
    )
    return updated, event


def reset(
    state: GroupState,
    targets: Mapping[str, int],
    now: float,
    identities: Mapping[str, str] | None = None,
    who: str = "an operator",
) -> GroupState:
    """Operator action (``streamgroup reset``): each shard of ``targets`` moves to its offset, backwards or
    forwards, with an event naming what is skipped or read again. A range in flight is fenced (its commit
    refused as ``reset``), a parked shard resumes, and the shard's log identity becomes the current one (the
    offsets were chosen in it). Offsets are checked against the stream by the caller."""
    shards: dict[str, ShardState] = {}
    events: list[GroupEvent] = []
    for shard_id, target in targets.items():
        shard = state.shards.get(shard_id)
        if shard is None:
            raise ValueError(f"shard {shard_id} is not a shard of group {state.group!r}")
        if isinstance(target, bool) or not isinstance(target, int) or target < 0:
            raise ValueError(f"offset of {shard_id} must be an int >= 0, got {target!r}")
        old = shard.committed
        identity = (identities or {}).get(shard_id) or shard.identity
        if old == target and shard.inflight is None and shard.parked is None and identity == shard.identity:
            continue
        if old is not None and shard.identity is not None and identity != shard.identity:
            # The log was recreated and no tick has said so yet: the old log's offsets go with it, named.
            gone = (
                f"the log of shard {shard_id} was deleted and created again (identity {shard.identity} -> "
                f"{identity}): offsets {old} and on of the old log were not read; {who} positions the new log"
            )
            events.append(GroupEvent(kind=EventKind.RECREATED, at=now, shard=shard_id, start=old, detail=gone))
            old = None
        if old is None or old == target:
            what = f"positioned at {target}"
        elif target > old:
            what = f"moved from {old} to {target}: [{old}, {target}) skipped"
        else:
            what = f"moved from {old} to {target}: [{target}, {old}) read again"
        detail = f"shard {shard_id} {what} by {who}"
        if shard.inflight is not None:
            detail += f"; the range [{shard.inflight.start}, {shard.inflight.end}) in flight is fenced"
        if shard.parked is not None:
            detail += f"; it was parked ({shard.parked.reason})"
        low, high = (target, target) if old is None else (min(old, target), max(old, target))
        events.append(GroupEvent(kind=EventKind.RESET, at=now, shard=shard_id, start=low, end=high, detail=detail))
        shards[shard_id] = _reposition(
            shard, state.members, now, "reset", committed=target, parked=None, identity=identity
        )
    if not shards:
        return state
    return add_events(state.model_copy(update={"shards": {**state.shards, **shards}}), *events)
